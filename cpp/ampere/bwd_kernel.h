// Ampere-path attention backward, main kernel: dK and dV of one key block, and its part of dQ.
//
// One CTA owns kBlockN keys of one (batch, kv head); K and V stay in shared memory while the
// CTA walks every query block of every query head in the GQA group, so dK and dV (registers,
// fp32) come out already summed over the group. Per query block, with P recomputed from the
// forward's LSE (never stored):
//   S = Q·Kᵀ, P = exp(scale·S - lse), dP = dO·Vᵀ, dS = P∘(dP - rowsum(dO∘O))
//   dV += Pᵀ·dO, dK += dSᵀ·Q (scaled once at the end).
// dQ, two designs:
// - kAddDq: this key block's dS·K is added into the fp32 dq_accum with vector reductions
//   (four values per instruction on sm90) while dK's GEMM runs; a last pass converts it
//   (bwd_dq_convert.h). Five GEMMs per block pair.
// - otherwise (deterministic calls): dQ comes from its own pass over query blocks
//   (bwd_dq_kernel.h), which recomputes S and dP: seven GEMMs per block pair, but every
//   gradient summed in a fixed order.
// Query blocks on the mask's edges (causal diagonal, window sides, seqlen_k tail; mask.h) apply
// the mask; the rest skip it with one warp-uniform branch. Without kGeneral, the mask has no left
// side (dense, causal, a window's right side); with it, also the left side, and the score hook
// (softcap, ALiBi) runs on S (score_hook.h) with softcap's chain factor on dS, and dropout
// (dropout.h) with its keep mask Z: dV += (P∘Z)ᵀ·dO, scaled by 1 / (1 - p) at the end, and
// dS = P∘(Z·dP / (1 - p) - rowsum(dO∘O)). (The loop body is
// written out, not a lambda: a lambda too large to inline would put the by-reference
// accumulators in local memory.)
// Variable-length batches (seq_view.h) take the kGeneral variant (run_bwd): offsets, lengths and
// mask come from the sequence's view there, while the other variants keep the fixed-length
// code. The grid is sized from the longest sequence; a CTA whose keys start past the sequence's
// key range exits, and one past its used keys (seqused_k) writes zero dK and dV.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm80.hpp>

#include "ampere/bwd_config.h"
#include "ampere/dropout_fragments.h"
#include "ampere/smem_gemm.h"
#include "dq_reduce.h"
#include "fragment_views.h"
#include "kernel_params.h"
#include "mask.h"
#include "online_softmax.h"
#include "score_hook.h"
#include "seq_view.h"

// Read the next k-slice of both operands before multiplying the current one (tuning knob).
#ifndef FLASHCUTE_AMPERE_BWD_LOOKAHEAD
#define FLASHCUTE_AMPERE_BWD_LOOKAHEAD 0
#endif

namespace flashcute::ampere {

// The general variant's sequence view, in shared memory and read where used: held in registers
// across the query-block loop, it made ptxas spill at the register cap (hd 128).
CUTE_DEVICE SeqView* shared_seq_view() {
  __shared__ SeqView view;
  return &view;
}

// The general variant's dropout keep bits (dropout_fragments.h) between their draw, before the
// S GEMM, and their use on P and dP: word w of thread t. Held in registers across the GEMMs,
// they spilled at the register cap (hd 128, sm90 code).
template <int kWords, int kThreads>
CUTE_DEVICE uint32_t& shared_keep_word(int w, int t) {
  __shared__ uint32_t words[kWords * kThreads];
  return words[w * kThreads + t];
}

template <class Traits, bool kAddDq, bool kGeneral>
CUTE_DEVICE void bwd_block(const BwdKernelParams& params, int pair_begin) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kQStages = Traits::kQStages;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using TileS = Shape<Int<kBlockM>, Int<kBlockN>>;

  extern __shared__ __align__(128) char smem_raw[];
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  Element* smem_p = smem + Traits::kOffsetP;
  Element* smem_ds = smem + Traits::kOffsetDS;
  auto smem_q = [&](int stage) { return smem + Traits::kOffsetQ + stage * Traits::kQElems; };
  auto smem_do = [&](int stage) { return smem + Traits::kOffsetDO + stage * Traits::kQElems; };

  const int tid = threadIdx.x;
  const int n_block = blockIdx.x;  // causal: low key blocks meet the most rows and start first
  // With kAddDq the grid's second dimension walks the chunk's (batch, kv head) pairs (its
  // dq_accum slots); without, it is the kv head and the third the batch.
  const int pair = kAddDq ? pair_begin + blockIdx.y : 0;
  const int batch = kAddDq ? pair / params.nheads_kv : blockIdx.z;
  const int kv_head = kAddDq ? pair % params.nheads_kv : blockIdx.y;
  const int n0 = n_block * kBlockN;
  // The sequence's view: without kGeneral always the fixed-length one (constants of the
  // parameters); with it, read from shared memory after the first barrier (see seq() below).
  const SeqView seq0 = kGeneral ? SeqView::of(params, batch)
                                : SeqView{0, 0, params.seqlen_q, params.seqlen_k, params.seqlen_k};
  if (kGeneral && n0 >= seq0.k_rows) return;  // keys of the next sequence
  if constexpr (kGeneral) {
    if (tid == 0) *shared_seq_view() = seq0;
  }
  auto seq = [&]() -> SeqView {
    if constexpr (kGeneral) return *shared_seq_view();
    else return seq0;
  };
  const int seqlen_k = seq0.seqlen_k;
  // Mask and hook are read from the kernel parameters where used (constant bank operands),
  // not held in registers: the kernels run at the register cap.
  const QueryBlockRange range = query_block_range<kBlockM, kBlockN, kGeneral>(seq0.mask(params), n0);
  const int head_first = kv_head * params.heads_per_kv;
  const int head_end = head_first + params.heads_per_kv;
  // A head dim below the kernel's (rounded up to it; general variant only, the others run at
  // the register cap): the columns past it are zero-filled in shared memory and neither read
  // nor written in global memory.
  const bool partial_cols = kGeneral && params.headdim < kHeadDim;

  typename Traits::GmemTiledCopyLoad gmem_copy;
  auto gmem_thr_copy = gmem_copy.get_thread_slice(tid);
  Tensor cQ = gmem_thr_copy.partition_S(make_identity_tensor(TileQ{}));
  Tensor cKV = gmem_thr_copy.partition_S(make_identity_tensor(TileKV{}));

  // K and V of this key block, zero past seqlen_k (rows there may hold anything, NaN included).
  {
    const Element* k_base = static_cast<const Element*>(params.k) + batch * params.k_batch_stride +
                            kv_head * params.k_head_stride + int64_t(seq0.k_start + n0) * params.k_row_stride;
    const Element* v_base = static_cast<const Element*>(params.v) + batch * params.v_batch_stride +
                            kv_head * params.v_head_stride + int64_t(seq0.k_start + n0) * params.v_row_stride;
    Tensor gK = make_tensor(make_gmem_ptr(k_base), TileKV{}, make_stride(params.k_row_stride, _1{}));
    Tensor gV = make_tensor(make_gmem_ptr(v_base), TileKV{}, make_stride(params.v_row_stride, _1{}));
    Tensor sK = make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem + Traits::kOffsetV), typename Traits::SmemLayoutKV{});
    if constexpr (kGeneral) {
      load_tile_zfill(gmem_copy, gmem_thr_copy.partition_S(gK), gmem_thr_copy.partition_D(sK), cKV, seqlen_k - n0,
                      params.headdim);
      load_tile_zfill(gmem_copy, gmem_thr_copy.partition_S(gV), gmem_thr_copy.partition_D(sV), cKV, seqlen_k - n0,
                      params.headdim);
    } else {
      load_tile<true>(gmem_copy, gmem_thr_copy.partition_S(gK), gmem_thr_copy.partition_D(sK), cKV, seqlen_k - n0);
      load_tile<true>(gmem_copy, gmem_thr_copy.partition_S(gV), gmem_thr_copy.partition_D(sV), cKV, seqlen_k - n0);
    }
  }

  // Q and dO of query block m of head h into a stage, zero past seqlen_q.
  auto load_q_do = [&](int h, int m, int stage) {
    const int64_t row0 = int64_t(m) * kBlockM;
    const int64_t tensor_row0 = seq().q_start + row0;
    const Element* q_base = static_cast<const Element*>(params.q) + batch * params.q_batch_stride +
                            h * params.q_head_stride + tensor_row0 * params.q_row_stride;
    const Element* do_base = static_cast<const Element*>(params.dout) + batch * params.dout_batch_stride +
                             h * params.dout_head_stride + tensor_row0 * params.dout_row_stride;
    Tensor gQ = make_tensor(make_gmem_ptr(q_base), TileQ{}, make_stride(params.q_row_stride, _1{}));
    Tensor gdO = make_tensor(make_gmem_ptr(do_base), TileQ{}, make_stride(params.dout_row_stride, _1{}));
    Tensor sQ = make_tensor(make_smem_ptr(smem_q(stage)), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(smem_do(stage)), typename Traits::SmemLayoutQ{});
    const int valid = seq().seqlen_q - int(row0);
    if constexpr (kGeneral) {
      // One zero-filling cp.async per chunk, rows and the call's columns predicated: no
      // branches (the variant runs at the register cap).
      load_tile_zfill(gmem_copy, gmem_thr_copy.partition_S(gQ), gmem_thr_copy.partition_D(sQ), cQ, valid,
                      params.headdim);
      load_tile_zfill(gmem_copy, gmem_thr_copy.partition_S(gdO), gmem_thr_copy.partition_D(sdO), cQ, valid,
                      params.headdim);
    } else if (valid < kBlockM) {
      load_tile<true>(gmem_copy, gmem_thr_copy.partition_S(gQ), gmem_thr_copy.partition_D(sQ), cQ, valid);
      load_tile<true>(gmem_copy, gmem_thr_copy.partition_S(gdO), gmem_thr_copy.partition_D(sdO), cQ, valid);
    } else {
      load_tile<false>(gmem_copy, gmem_thr_copy.partition_S(gQ), gmem_thr_copy.partition_D(sQ), cQ, valid);
      load_tile<false>(gmem_copy, gmem_thr_copy.partition_S(gdO), gmem_thr_copy.partition_D(sdO), cQ, valid);
    }
  };

  // S = Q·Kᵀ and dP = dO·Vᵀ: both operands K-major, plain ldmatrix.
  typename Traits::TiledMmaSdP mma_sdp;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto copy_a_sdp = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_sdp);
  auto copy_b_sdp = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma_sdp);
  auto thr_copy_a_sdp = copy_a_sdp.get_thread_slice(tid);
  auto thr_copy_b_sdp = copy_b_sdp.get_thread_slice(tid);
  Tensor sK = make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(smem + Traits::kOffsetV), typename Traits::SmemLayoutKV{});
  Tensor tSrQ = thr_sdp.partition_fragment_A(make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutQ{}));
  Tensor tSrK = thr_sdp.partition_fragment_B(sK);
  Tensor tSsK = thr_copy_b_sdp.partition_S(sK);
  Tensor tSsV = thr_copy_b_sdp.partition_S(sV);

  // dV += Pᵀ·dO and dK += dSᵀ·Q: every operand transposed, ldmatrix.trans.
  typename Traits::TiledMmadKV mma_dkv;
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto copy_a_dkv = make_tiled_copy_A(typename Traits::SmemCopyAtomTransposed{}, mma_dkv);
  auto copy_b_dkv = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_dkv);
  auto thr_copy_a_dkv = copy_a_dkv.get_thread_slice(tid);
  auto thr_copy_b_dkv = copy_b_dkv.get_thread_slice(tid);
  Tensor sPt = make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutPt{});
  Tensor sdSt = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutPt{});
  Tensor tdKVrPt = thr_dkv.partition_fragment_A(sPt);
  Tensor tdKVrQt = thr_dkv.partition_fragment_B(
      make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutQt{}));
  Tensor acc_dk = partition_fragment_C(mma_dkv, TileKV{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, TileKV{});
  clear(acc_dk);
  clear(acc_dv);

  // dQ part = dS·K: dS read as stored, Kᵀ by transposed ldmatrix.
  typename Traits::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tid);
  auto copy_a_dq = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_dq);
  auto copy_b_dq = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_dq);
  auto thr_copy_a_dq = copy_a_dq.get_thread_slice(tid);
  auto thr_copy_b_dq = copy_b_dq.get_thread_slice(tid);
  Tensor sdS = make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutP{});
  Tensor sKt = make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutKt{});
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);

  // P and dS registers -> shared memory.
  auto copy_p = make_tiled_copy_C(typename Traits::SmemCopyAtomStore{}, mma_sdp);
  auto thr_copy_p = copy_p.get_thread_slice(tid);
  Tensor tPsP = thr_copy_p.partition_D(make_tensor(make_smem_ptr(smem_p), typename Traits::SmemLayoutP{}));
  Tensor tPsdS = thr_copy_p.partition_D(make_tensor(make_smem_ptr(smem_ds), typename Traits::SmemLayoutP{}));
  // kGeneral with softcap: this thread's dS slots hold its scores' chain factors (fp16) from S
  // until dS overwrites them.
  Tensor tPsFactor = thr_copy_p.partition_D(make_tensor(
      make_smem_ptr(reinterpret_cast<cutlass::half_t*>(smem_ds)), typename Traits::SmemLayoutP{}));

  // Score coordinates: this thread's first element plus compile-time offsets (see mask.h).
  Tensor cS = make_identity_tensor(TileS{});
  Tensor tScS = thr_sdp.partition_C(cS);
  Tensor tScS0 = mma_sdp.get_thread_slice(0).partition_C(cS);
  Tensor score_offsets_rc = make_tensor(tScS0.data(), rowcol_layout(tScS0.layout()));
  constexpr int kRows = decltype(size<0>(score_offsets_rc))::value;
  const float scale_log2 = params.scale_log2;
  constexpr float kLog2e = 1.4426950408889634f;

  // The i-th query block visited: in range order (mask.h) where dQ is added into dq_accum,
  // plain order otherwise (no reductions to spread, and the registers are at the cap).
  auto query_block = [&](int i) { return kAddDq ? range.at(i) : range.begin + i; };
  const bool has_work = range.begin < range.end && head_first < head_end;
  if constexpr (kGeneral) __syncthreads();  // the shared view written
  if (has_work) load_q_do(head_first, query_block(0), 0);
  cp_async_fence();

  int stage = 0;
  for (int h = head_first; h < head_end; ++h) {
    for (int i = 0; i < range.count(); ++i) {
      const int m = query_block(i);
      // The next (head, query block) this CTA visits, if any.
      int h_next = h, i_next = i + 1;
      if (i_next == range.count()) h_next = h + 1, i_next = 0;
      const int m_next = query_block(i_next);
      const bool has_next = h_next < head_end;

      cp_async_wait<0>();
      __syncthreads();  // Q/dO of this block landed; last block's readers of P/dS and Q/dO are done
      if constexpr (kQStages == 2) {
        if (has_next) load_q_do(h_next, m_next, stage ^ 1);
        cp_async_fence();
      }

      const int row0 = m * kBlockM;
      const float* lse_base =
          params.lse + batch * params.lse_batch_stride + h * params.lse_head_stride + seq().q_start;
      const float* row_dot_base =
          params.row_dot + (int64_t(batch) * params.nheads + h) * params.seqlen_q_padded;
      const int thread_row = row0 + get<0>(tScS(0));
      // Per row: lse in log2 units (+inf where no P may survive: rows past seqlen_q, rows that
      // saw no key) and rowsum(dO∘O).
      float lse_log2[kRows], row_dot[kRows];
      auto read_row_dot = [&] {
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const int row = thread_row + get<0>(score_offsets_rc(r, 0));
          row_dot[r] = row < seq().seqlen_q ? row_dot_base[row] : 0.f;
        }
      };
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = thread_row + get<0>(score_offsets_rc(r, 0));
        const float lse = row < seq().seqlen_q ? lse_base[row] : INFINITY;
        lse_log2[r] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      }
      // Where the kernel sits at the register cap, when rowsum(dO∘O) is read decides whether
      // ptxas spills: with 64 scores per thread (hd 64's 128 x 128 tile) and no dQ GEMM after
      // S, else before (each placement measured spill-free).
      constexpr bool kRowDotAfterS = !kAddDq && kBlockM * kBlockN / Traits::kNThreads > 32;
      if constexpr (!kRowDotAfterS) read_row_dot();

      // General variant: dropout's keep bits, drawn before S takes its registers and kept in
      // shared memory until P and dP use them (dropout_fragments.h). This MMA's warps along N
      // leave a thread half of each group.
      using KeepS = KeepMaskFor<decltype(score_offsets_rc)>;
      if constexpr (kGeneral) {
        if (params.dropout_threshold != 0) {  // uniform
          KeepS keep;
          keep.template draw<false, kHeadDim <= 128 ? 2 : 1>(Dropout::of(params), score_offsets_rc, m * kBlockM + get<0>(tScS(0)),
                                    n0 + get<1>(tScS(0)), batch * params.nheads + h);
          CUTE_UNROLL
          for (int w = 0; w < KeepS::kWords; ++w)
            shared_keep_word<KeepS::kWords, Traits::kNThreads>(w, tid) = keep.words[w];
        }
      }

      Tensor sQ = make_tensor(make_smem_ptr(smem_q(stage)), typename Traits::SmemLayoutQ{});
      Tensor sdO = make_tensor(make_smem_ptr(smem_do(stage)), typename Traits::SmemLayoutQ{});
      Tensor acc_s = partition_fragment_C(mma_sdp, TileS{});
      clear(acc_s);
      gemm_from_smem<false, FLASHCUTE_AMPERE_BWD_LOOKAHEAD != 0>(acc_s, tSrQ, tSrK, thr_copy_a_sdp.partition_S(sQ), thr_copy_a_sdp.retile_D(tSrQ),
                                   tSsK, thr_copy_b_sdp.retile_D(tSrK), mma_sdp, copy_a_sdp, copy_b_sdp);
      Tensor acc_s_rc = rowcol_view(acc_s);
      if constexpr (kGeneral) {
        if (ScoreHook::of(params).active()) {  // uniform: softcap and ALiBi, before the mask
          const ScoreHook hook = ScoreHook::of(params);
          if (hook.softcap()) {
            // Softcap's chain factor 1 - tanh² waits for P as fp16 where this thread's dS goes
            // later (the dS buffer is free until then, and no other thread writes there).
            Tensor factor = make_tensor<cutlass::half_t>(shape(acc_s));
            CUTE_UNROLL
            for (int i = 0; i < size(acc_s); ++i) factor(i) = cutlass::half_t(hook.cap(acc_s(i)));
            copy(copy_p, thr_copy_p.retile_S(factor), tPsFactor);
          }
          // The sequence's offset (its mask's) from the kept seqlen_k: reading both lengths
          // from the shared view spilled at hd 64.
          if (hook.alibi())
            ScoreHook::add_alibi(acc_s_rc, score_offsets_rc, thread_row, n0 + get<1>(tScS(0)),
                                 seqlen_k - seq().seqlen_q, hook.alibi_slope(batch, h));
        }
      }
      if (range.needs_mask(m, kGeneral))  // warp-uniform: the bulk skips the mask
        seq().mask(params).template apply_sides<kGeneral>(acc_s_rc, score_offsets_rc, thread_row, n0 + get<1>(tScS(0)));
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(acc_s_rc); ++c)
          acc_s_rc(r, c) = fast_exp2(fmaf(acc_s_rc(r, c), scale_log2, -lse_log2[r]));
      }

      // P goes to shared memory now. dS needs it again after dP = dO·Vᵀ (with softcap, times its
      // chain factor): it waits as fp16 pairs, half the registers of fp32 (which spilled at the
      // 255-register cap). P is in [0, 1], so fp16 keeps it to 2^-11 relative, finer than dS's
      // own rounding to Element.
      Tensor p_store = convert_fragment<Element>(acc_s);
      if constexpr (kGeneral) {
        if (params.dropout_threshold != 0) {  // uniform
          // dV's operand is P∘Z: the dropped weights zeroed in the copy that goes to shared
          // memory (acc_s keeps P for dS).
          KeepS keep;
          CUTE_UNROLL
          for (int w = 0; w < KeepS::kWords; ++w)
            keep.words[w] = shared_keep_word<KeepS::kWords, Traits::kNThreads>(w, tid);
          Tensor p_store_rc = rowcol_view(p_store);
          keep.apply(p_store_rc);
        }
      }
      copy(copy_p, thr_copy_p.retile_S(p_store), tPsP);
      if constexpr (kGeneral) {
        // dS takes softcap's chain factor with P: the fp16 copy below holds P times it.
        if (ScoreHook::of(params).softcap()) {  // uniform
          Tensor factor = make_tensor<cutlass::half_t>(shape(acc_s));
          copy(tPsFactor, thr_copy_p.retile_S(factor));
          CUTE_UNROLL
          for (int i = 0; i < size(acc_s); ++i) acc_s(i) *= float(factor(i));
        }
      }
      Tensor p_half = convert_fragment<cutlass::half_t>(acc_s);
      Tensor p_half_rc = rowcol_view(p_half);
      if constexpr (kRowDotAfterS) read_row_dot();

      Tensor acc_dp = partition_fragment_C(mma_sdp, TileS{});
      clear(acc_dp);
      gemm_from_smem<false, FLASHCUTE_AMPERE_BWD_LOOKAHEAD != 0>(acc_dp, tSrQ, tSrK, thr_copy_a_sdp.partition_S(sdO), thr_copy_a_sdp.retile_D(tSrQ),
                                   tSsV, thr_copy_b_sdp.retile_D(tSrK), mma_sdp, copy_a_sdp, copy_b_sdp);
      Tensor acc_dp_rc = rowcol_view(acc_dp);
      if constexpr (kGeneral) {
        // dS = P∘(Z·dP / (1 - p) - rowsum(dO∘O)) with dropout's keep mask Z from the bits in
        // shared memory; without dropout Z = 1 and the rescale is 1 (the same dS, exactly).
        KeepS keep;
        CUTE_UNROLL
        for (int w = 0; w < KeepS::kWords; ++w)
          keep.words[w] = params.dropout_threshold != 0 ? shared_keep_word<KeepS::kWords, Traits::kNThreads>(w, tid)
                                                        : ~0u;
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          CUTE_UNROLL
          for (int c = 0; c < size<1>(acc_dp_rc); ++c)
            acc_dp_rc(r, c) = float(p_half_rc(r, c)) *
                              fmaf(acc_dp_rc(r, c), keep.kept(r, c) ? params.dropout_rescale : 0.f, -row_dot[r]);
        }
      } else {
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          CUTE_UNROLL
          for (int c = 0; c < size<1>(acc_dp_rc); ++c)
            acc_dp_rc(r, c) = float(p_half_rc(r, c)) * (acc_dp_rc(r, c) - row_dot[r]);
        }
      }

      copy(copy_p, thr_copy_p.retile_S(convert_fragment<Element>(acc_dp)), tPsdS);
      __syncthreads();  // P and dS visible to every warp

      Tensor sdOt = make_tensor(make_smem_ptr(smem_do(stage)), typename Traits::SmemLayoutQt{});
      Tensor sQt = make_tensor(make_smem_ptr(smem_q(stage)), typename Traits::SmemLayoutQt{});
      gemm_from_smem<false, FLASHCUTE_AMPERE_BWD_LOOKAHEAD != 0>(acc_dv, tdKVrPt, tdKVrQt, thr_copy_a_dkv.partition_S(sPt),
                                   thr_copy_a_dkv.retile_D(tdKVrPt), thr_copy_b_dkv.partition_S(sdOt),
                                   thr_copy_b_dkv.retile_D(tdKVrQt), mma_dkv, copy_a_dkv, copy_b_dkv);
      if constexpr (kAddDq) {
        Tensor acc_dq = partition_fragment_C(mma_dq, TileQ{});
        clear(acc_dq);
        gemm_from_smem<false, FLASHCUTE_AMPERE_BWD_LOOKAHEAD != 0>(acc_dq, tdQrdS, tdQrKt, thr_copy_a_dq.partition_S(sdS),
                                     thr_copy_a_dq.retile_D(tdQrdS), thr_copy_b_dq.partition_S(sKt),
                                     thr_copy_b_dq.retile_D(tdQrKt), mma_dq, copy_a_dq, copy_b_dq);
        // Into dq_accum in register order, each warp's 512 bytes contiguous (fire and forget:
        // the dK GEMM below runs while they drain). Rows past seqlen_q add zeros into padding.
        const int slot = (pair - pair_begin) * params.heads_per_kv + (h - head_first);
        float* dst = params.dq_accum + (int64_t(slot) * params.seqlen_q_padded + row0) * kHeadDim + tid * 4;
        static_assert(size(decltype(acc_dq){}) % 4 == 0);
        CUTE_UNROLL
        for (int i = 0; i < size(acc_dq); i += 4)
          red_add_f32x4(dst + i * Traits::kNThreads, acc_dq(i), acc_dq(i + 1), acc_dq(i + 2), acc_dq(i + 3));
      }
      gemm_from_smem<false, FLASHCUTE_AMPERE_BWD_LOOKAHEAD != 0>(acc_dk, tdKVrPt, tdKVrQt, thr_copy_a_dkv.partition_S(sdSt),
                                   thr_copy_a_dkv.retile_D(tdKVrPt), thr_copy_b_dkv.partition_S(sQt),
                                   thr_copy_b_dkv.retile_D(tdKVrQt), mma_dkv, copy_a_dkv, copy_b_dkv);
      if constexpr (kQStages == 1) {
        __syncthreads();  // every warp is done with Q and dO
        if (has_next) load_q_do(h_next, m_next, 0);
        cp_async_fence();
      }
      if constexpr (kQStages == 2) stage ^= 1;
    }
  }

  // Epilogue: dK scaled, both converted and staged through K/V's shared memory for 16-byte
  // row stores; keys past the key range are not written (those in [seqlen_k, k_rows), past
  // seqused_k, get the zeros their masked scores left).
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= params.softmax_scale;
  if constexpr (kGeneral) {
    // Dropout's 1 / (1 - p) on (P∘Z)ᵀ·dO, once (1 without dropout).
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dv); ++i) acc_dv(i) *= params.dropout_rescale;
  }
  Tensor dk = convert_fragment<Element>(acc_dk);
  Tensor dv = convert_fragment<Element>(acc_dv);
  cp_async_wait<0>();
  __syncthreads();  // K and V are no longer read
  // General variant: the epilogue's thread offsets computed afresh from an opaque thread
  // index. Derived from tid, they equal the K/V loads' offsets, which ptxas then kept live
  // through the query-block loop and spilled (sm80 code at hd 128-256, sm90 at hd 64 and 128).
  int tid_epi = tid;
  if constexpr (kGeneral)
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid_epi));
  auto copy_dkv = make_tiled_copy_C(typename Traits::SmemCopyAtomStore{}, mma_dkv);
  auto thr_copy_dkv = copy_dkv.get_thread_slice(tid_epi);
  copy(copy_dkv, thr_copy_dkv.retile_S(dk), thr_copy_dkv.partition_D(sK));
  copy(copy_dkv, thr_copy_dkv.retile_S(dv), thr_copy_dkv.partition_D(sV));
  __syncthreads();

  Element* dk_base = static_cast<Element*>(params.dk) + batch * params.dk_batch_stride +
                     kv_head * params.dk_head_stride + int64_t(seq().k_start + n0) * params.dk_row_stride;
  Element* dv_base = static_cast<Element*>(params.dv) + batch * params.dv_batch_stride +
                     kv_head * params.dv_head_stride + int64_t(seq().k_start + n0) * params.dv_row_stride;
  Tensor gdK = make_tensor(make_gmem_ptr(dk_base), TileKV{}, make_stride(params.dk_row_stride, _1{}));
  Tensor gdV = make_tensor(make_gmem_ptr(dv_base), TileKV{}, make_stride(params.dv_row_stride, _1{}));
  typename Traits::GmemTiledCopyStore gmem_store;
  auto gmem_thr_store = gmem_store.get_thread_slice(tid_epi);
  Tensor tsK = gmem_thr_store.partition_S(sK);
  Tensor tsV = gmem_thr_store.partition_S(sV);
  Tensor tgK = gmem_thr_store.partition_D(gdK);
  Tensor tgV = gmem_thr_store.partition_D(gdV);
  Tensor trK = make_fragment_like(tsK);
  Tensor trV = make_fragment_like(tsV);
  copy(gmem_store, tsK, trK);
  copy(gmem_store, tsV, trV);
  Tensor tcKV = gmem_thr_store.partition_D(make_identity_tensor(TileKV{}));
  if (partial_cols) {
    store_tile_cols(gmem_store, trK, tgK, tcKV, seq().k_rows - n0, params.headdim);
    store_tile_cols(gmem_store, trV, tgV, tcKV, seq().k_rows - n0, params.headdim);
    return;
  }
  CUTE_UNROLL
  for (int r = 0; r < size<1>(tgK); ++r) {
    if (n0 + get<0>(tcKV(0, r, 0)) < seq().k_rows) {
      copy(gmem_store, trK(_, r, _), tgK(_, r, _));
      copy(gmem_store, trV(_, r, _), tgV(_, r, _));
    }
  }
}

// One kernel symbol per (dtype, head dim, dQ design, general); tile shapes follow the code
// generation it was compiled for (see bwd_config.h). This kernel sits at the register cap, where
// runtime branches for the score hook (softcap, ALiBi) and a window's left side made ptxas
// spill: they are a template switch here (kGeneral), compiled with the atomic-free design only
// (run_bwd).
template <class Element, int kHeadDim, bool kAddDq, bool kGeneral = false>
__global__ void __launch_bounds__(
    BwdTraitsFor<Element, kHeadDim, FLASHCUTE_AMPERE_TILE_ARCH>::type::kNThreads, 1)
    bwd_kernel(__grid_constant__ const BwdKernelParams params, int pair_begin) {
#if defined(__CUDA_ARCH__)
  if constexpr (compiled_for<kHeadDim, FLASHCUTE_AMPERE_TILE_ARCH>())
    bwd_block<typename BwdTraitsFor<Element, kHeadDim, FLASHCUTE_AMPERE_TILE_ARCH>::type, kAddDq, kGeneral>(params,
                                                                                                   pair_begin);
#endif
}

}  // namespace flashcute::ampere
