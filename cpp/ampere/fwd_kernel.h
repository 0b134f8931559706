// Ampere-path attention forward: cp.async K/V pipeline, ldmatrix, mma.sync through TiledMma.
//
// One CTA computes O for kBlockM query rows of one (batch, head). Key blocks are visited from
// the last to the first, so the blocks that need masking (the seqlen_k tail, the causal
// diagonal or the window's right side) come first, the unmasked bulk runs without mask code,
// and the blocks on the window's left side (mask.h) come last.
//
// Dropout (dropout.h) is a uniform branch per block: after the online softmax has taken the
// block's weights into the row sums (the LSE is dropout's), the dropped weights are zeroed in
// P before P·V, and O takes 1 / (1 - p) with its normalization.
//
// Variable-length batches (seq_view.h): the grid is sized from the longest sequence; a CTA
// whose rows start past its sequence's end exits at once, and every row and key offset, length
// and mask comes from the sequence's view (constants of the parameters for a fixed-length call).
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm80.hpp>

#include "ampere/fwd_config.h"
#include "ampere/dropout_fragments.h"
#include "ampere/smem_gemm.h"
#include "fragment_views.h"
#include "kernel_params.h"
#include "mask.h"
#include "online_softmax.h"
#include "score_hook.h"
#include "seq_view.h"

namespace flashcute::ampere {

// acc += P·V, P taken from the fp32 scores in registers and converted to Element one k-slice
// (16 keys) at a time, so only a slice of P is live next to the scores. V slices are read
// just before use (reading ahead measured no faster and costs registers).
template <class Element, class Acc, class ScoresA, class FragB, class SmemB, class ViewB,
          class TiledMma, class CopyB>
CUTE_DEVICE void gemm_pv(Acc& acc, ScoresA const& scores_a, FragB const& frag_b, SmemB const& smem_b,
                         ViewB&& view_b, TiledMma const& mma, CopyB const& copy_b) {
  using namespace cute;
  constexpr int kSlices = decltype(size<2>(scores_a))::value;
  CUTE_UNROLL
  for (int k = 0; k < kSlices; ++k) {
    copy(copy_b, smem_b(_, _, k), view_b(_, _, k));
    Tensor p = convert_fragment<Element>(scores_a(_, _, k));
    gemm(mma, p, frag_b(_, _, k), acc);
  }
}

template <class Traits>
CUTE_DEVICE void fwd_block(const FwdKernelParams params) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;

  extern __shared__ __align__(128) char smem_raw[];
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  // [stage 0][Q | stages 1..] when Q moves to registers, else [Q][stage 0][stages 1..].
  Element* smem_q = Traits::kQInRegs ? smem + Traits::kStageElems : smem;
  auto stage_k = [&](int stage) {
    Element* base = Traits::kQInRegs
                        ? (stage == 0 ? smem : smem_q + (stage - 1) * Traits::kStageElems)
                        : smem + Traits::kQElems + stage * Traits::kStageElems;
    return base;
  };

  const int tid = threadIdx.x;
  // Causal CTAs with more keys come first, so the longest work does not trail the grid.
  const int m_block = params.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / params.heads_per_kv;
  const int row0 = m_block * kBlockM;
  const SeqView seq = SeqView::of(params, batch);
  // Rows of the next sequence (a shorter one than the grid's): nothing to compute or write.
  if (row0 >= seq.seqlen_q) return;
  const int seqlen_q = seq.seqlen_q;
  const int seqlen_k = seq.seqlen_k;

  // The hook is read from the kernel parameters where used (constant bank operands), not
  // held in registers: the kernels run at the register cap.
  const KeyBlockRange range = key_block_range<kBlockN>(seq.mask(params), row0, kBlockM);
  const int n_begin = range.n_begin;
  // A head dim below the kernel's (rounded up to it): the columns past it are zeros in shared
  // memory and neither loaded nor stored (smem_gemm.h). One uniform branch per copy; the
  // kernel's own head dim runs the copies without column tests.
  const bool partial_cols = params.headdim < kHeadDim;

  const Element* q_base = static_cast<const Element*>(params.q) + batch * params.q_batch_stride +
                          head * params.q_head_stride + int64_t(seq.q_start + row0) * params.q_row_stride;
  const Element* k_base = static_cast<const Element*>(params.k) + batch * params.k_batch_stride +
                          kv_head * params.k_head_stride + int64_t(seq.k_start) * params.k_row_stride;
  const Element* v_base = static_cast<const Element*>(params.v) + batch * params.v_batch_stride +
                          kv_head * params.v_head_stride + int64_t(seq.k_start) * params.v_row_stride;

  Tensor gQ = make_tensor(make_gmem_ptr(q_base), TileQ{}, make_stride(params.q_row_stride, _1{}));
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});

  typename Traits::GmemTiledCopyLoad gmem_copy;
  auto gmem_thr_copy = gmem_copy.get_thread_slice(tid);
  Tensor cQ = gmem_thr_copy.partition_S(make_identity_tensor(TileQ{}));
  Tensor cKV = gmem_thr_copy.partition_S(make_identity_tensor(TileKV{}));

  // Issues the cp.async copies of key block n into a pipeline stage. Only the first block
  // loaded (the highest one) can be partial; every refill inside the loop is a full block.
  // Rows past seqlen_k land as zeros: they may belong to the next sequence or be unused keys
  // past seqused_k holding anything (NaN included), and P = 0 times NaN would poison P·V.
  auto load_kv = [&](int n, int stage, auto may_be_partial) {
    Element* sk_ptr = stage_k(stage);
    Tensor sK = make_tensor(make_smem_ptr(sk_ptr), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(sk_ptr + Traits::kKVElems), typename Traits::SmemLayoutKV{});
    const int64_t row = int64_t(n) * kBlockN;
    Tensor gK = make_tensor(make_gmem_ptr(k_base + row * params.k_row_stride), TileKV{},
                            make_stride(params.k_row_stride, _1{}));
    Tensor gV = make_tensor(make_gmem_ptr(v_base + row * params.v_row_stride), TileKV{},
                            make_stride(params.v_row_stride, _1{}));
    Tensor tKgK = gmem_thr_copy.partition_S(gK);
    Tensor tKsK = gmem_thr_copy.partition_D(sK);
    Tensor tVgV = gmem_thr_copy.partition_S(gV);
    Tensor tVsV = gmem_thr_copy.partition_D(sV);
    const int valid = seqlen_k - n * kBlockN;
    if (partial_cols) {
      load_tile_cols<decltype(may_be_partial)::value>(gmem_copy, tKgK, tKsK, cKV, valid, params.headdim);
      load_tile_cols<decltype(may_be_partial)::value>(gmem_copy, tVgV, tVsV, cKV, valid, params.headdim);
    } else if (decltype(may_be_partial)::value && valid < kBlockN) {
      load_tile<true>(gmem_copy, tKgK, tKsK, cKV, valid);
      load_tile<true>(gmem_copy, tVgV, tVsV, cKV, valid);
    } else {
      load_tile<false>(gmem_copy, tKgK, tKsK, cKV, valid);
      load_tile<false>(gmem_copy, tVgV, tVsV, cKV, valid);
    }
  };

  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  auto smem_thr_copy_q = smem_copy_q.get_thread_slice(tid);
  auto smem_thr_copy_k = smem_copy_k.get_thread_slice(tid);
  auto smem_thr_copy_v = smem_copy_v.get_thread_slice(tid);

  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  Tensor tSsQ = smem_thr_copy_q.partition_S(sQ);
  Tensor tSrQ_view = smem_thr_copy_q.retile_D(tSrQ);
  Tensor tSrK = thr_mma.partition_fragment_B(
      make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutKV{}));
  Tensor tOrVt = thr_mma.partition_fragment_B(
      make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutVt{}));
  Tensor tSrK_view = smem_thr_copy_k.retile_D(tSrK);
  Tensor tOrVt_view = smem_thr_copy_v.retile_D(tOrVt);

  Tensor acc_o = partition_fragment_C(tiled_mma, TileQ{});
  clear(acc_o);
  Tensor acc_o_rc = rowcol_view(acc_o);
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;
  OnlineSoftmax<kRows> softmax(params.scale_log2);
  // Score coordinates: this thread's first element plus offsets known at compile time.
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tScS = thr_mma.partition_C(cS);
  Tensor tScS0 = tiled_mma.get_thread_slice(0).partition_C(cS);
  Tensor score_offsets_rc = make_tensor(tScS0.data(), rowcol_layout(tScS0.layout()));
  const int thread_row = row0 + get<0>(tScS(0));
  const int thread_col = get<1>(tScS(0));

  // Prologue: Q, then the first kStages-1 key blocks.
  // Columns past the head dim are zeroed once per buffer (smem_gemm.h): Q's and stage 0's here,
  // the other stages' once Q has left the buffer they share with it.
  auto clear_stage_cols = [&](int stage) {
    Element* sk_ptr = stage_k(stage);
    clear_tile_cols(gmem_thr_copy.partition_D(make_tensor(make_smem_ptr(sk_ptr), typename Traits::SmemLayoutKV{})),
                    cKV, params.headdim);
    clear_tile_cols(gmem_thr_copy.partition_D(
                        make_tensor(make_smem_ptr(sk_ptr + Traits::kKVElems), typename Traits::SmemLayoutKV{})),
                    cKV, params.headdim);
  };
  if (partial_cols) {
    Tensor tQsQ = gmem_thr_copy.partition_D(sQ);
    clear_tile_cols(tQsQ, cQ, params.headdim);
    load_tile_cols<true>(gmem_copy, gmem_thr_copy.partition_S(gQ), tQsQ, cQ, seqlen_q - row0, params.headdim);
    clear_stage_cols(0);
  } else {
    load_tile<true>(gmem_copy, gmem_thr_copy.partition_S(gQ), gmem_thr_copy.partition_D(sQ), cQ,
                    seqlen_q - row0);
  }
  cp_async_fence();
  int n = range.n_end - 1;
  if (n >= n_begin) load_kv(n, 0, cute::true_type{});
  cp_async_fence();
  if constexpr (Traits::kQInRegs) {
    cp_async_wait<1>();
    __syncthreads();
    copy(smem_copy_q, tSsQ, tSrQ_view);
    __syncthreads();  // Q's smem is stage 1 from here on
  }
  if (partial_cols) {
    CUTE_UNROLL
    for (int s = 1; s < kStages; ++s) clear_stage_cols(s);
  }
  CUTE_UNROLL
  for (int s = 1; s < kStages - 1; ++s) {
    if (n - s >= n_begin) load_kv(n - s, s, cute::false_type{});
    cp_async_fence();
  }

  int stage = 0;
  auto process_block = [&](int n_block, auto masked) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // block n_block visible; every warp is done with the stage refilled next
    const int refill = n_block - (kStages - 1);
    const int refill_stage = stage == 0 ? kStages - 1 : stage - 1;
    if (refill >= n_begin) load_kv(refill, refill_stage, cute::false_type{});
    cp_async_fence();

    Element* sk_ptr = stage_k(stage);
    Tensor sK = make_tensor(make_smem_ptr(sk_ptr), typename Traits::SmemLayoutKV{});
    Tensor sVt = make_tensor(make_smem_ptr(sk_ptr + Traits::kKVElems), typename Traits::SmemLayoutVt{});

    // Dropout's keep bits, drawn before the scores take their registers (dropout_fragments.h).
    KeepMaskFor<decltype(score_offsets_rc)> keep;
    if (params.dropout_threshold != 0)  // uniform
      keep.template draw<true, kHeadDim <= 64 ? 2 : 1>(Dropout::of(params), score_offsets_rc, thread_row, n_block * kBlockN + thread_col,
                               batch * params.nheads + head);

    Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    gemm_from_smem<Traits::kQInRegs, Traits::kLookaheadK>(acc_s, tSrQ, tSrK, tSsQ, tSrQ_view,
                                     smem_thr_copy_k.partition_S(sK), tSrK_view, tiled_mma,
                                     smem_copy_q, smem_copy_k);
    Tensor acc_s_rc = rowcol_view(acc_s);
    if (ScoreHook::of(params).active()) {  // uniform: softcap and ALiBi, before the mask
      const ScoreHook hook = ScoreHook::of(params);
      hook.apply(acc_s_rc, score_offsets_rc, thread_row, n_block * kBlockN + thread_col,
                 seq.mask(params).offset(), hook.alibi_slope(batch, head));
    }
    if constexpr (decltype(masked)::value)
      seq.mask(params).apply(acc_s_rc, score_offsets_rc, thread_row, n_block * kBlockN + thread_col);
    softmax.update(acc_s_rc, acc_o_rc);
    // Dropout after the row sums took every weight (the LSE is dropout's); the kept weights'
    // 1 / (1 - p) waits for the output's normalization. Warps split the rows only, so each
    // thread holds whole groups of dropout.h's bits.
    if (params.dropout_threshold != 0) keep.apply(acc_s_rc);  // uniform

    Tensor scores_a = make_tensor(acc_s.data(), acc_to_a_operand_layout(acc_s.layout()));
    gemm_pv<Element>(acc_o, scores_a, tOrVt, smem_thr_copy_v.partition_S(sVt), tOrVt_view,
                     tiled_mma, smem_copy_v);
    stage = stage + 1 == kStages ? 0 : stage + 1;
  };

  // Masked blocks on the right edge, the unmasked bulk, then (second pass) masked blocks on
  // the left edge: one call site per variant, so both stay inlined (a lambda left out of line
  // would put the by-reference accumulators in local memory).
  for (int masked_end = cute::max(n_begin, range.n_unmasked); n >= n_begin; masked_end = n_begin) {
    for (; n >= masked_end; --n) process_block(n, cute::true_type{});
    for (; n >= n_begin && n >= range.n_unmasked_begin; --n) process_block(n, cute::false_type{});
  }

  // Epilogue: normalize, stage O through shared memory for 16-byte row stores, write LSE.
  float lse[kRows];
  softmax.finalize(acc_o_rc, lse, params.dropout_rescale);  // 1 without dropout
  Tensor o = convert_fragment<Element>(acc_o);
  cp_async_wait<0>();
  __syncthreads();  // O reuses Q's smem, which may have been a K/V stage

  Tensor sO = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutO{});
  auto smem_copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_copy_o = smem_copy_o.get_thread_slice(tid);
  copy(smem_copy_o, smem_thr_copy_o.retile_S(o), smem_thr_copy_o.partition_D(sO));

  if (params.lse != nullptr && tid % 4 == 0) {
    float* lse_base = params.lse + batch * params.lse_batch_stride + head * params.lse_head_stride + seq.q_start;
    Tensor tOcO = thr_mma.partition_C(make_identity_tensor(TileQ{}));
    Tensor tOcO_rc = make_tensor(tOcO.data(), rowcol_layout(tOcO.layout()));
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = row0 + get<0>(tOcO_rc(r, 0));
      if (row < seqlen_q) lse_base[row] = lse[r];
    }
  }
  __syncthreads();

  Element* o_base = static_cast<Element*>(params.out) + batch * params.out_batch_stride +
                    head * params.out_head_stride + int64_t(seq.q_start + row0) * params.out_row_stride;
  Tensor gO = make_tensor(make_gmem_ptr(o_base), TileQ{}, make_stride(params.out_row_stride, _1{}));
  typename Traits::GmemTiledCopyStore gmem_copy_o;
  auto gmem_thr_copy_o = gmem_copy_o.get_thread_slice(tid);
  Tensor tOsO = gmem_thr_copy_o.partition_S(sO);
  Tensor tOgO = gmem_thr_copy_o.partition_D(gO);
  Tensor tOrO = make_fragment_like(tOsO);
  copy(gmem_copy_o, tOsO, tOrO);
  Tensor tOcO = gmem_thr_copy_o.partition_D(make_identity_tensor(TileQ{}));
  if (partial_cols) {
    store_tile_cols(gmem_copy_o, tOrO, tOgO, tOcO, seqlen_q - row0, params.headdim);
    return;
  }
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tOgO); ++m) {
    if (row0 + get<0>(tOcO(0, m, 0)) < seqlen_q) copy(gmem_copy_o, tOrO(_, m, _), tOgO(_, m, _));
  }
}

// One kernel symbol per (dtype, head dim); its tile shapes follow the code generation it was
// compiled for (see fwd_config.h).
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(
    FwdTraitsFor<Element, kHeadDim, FLASHCUTE_AMPERE_TILE_ARCH>::type::kNThreads, 1)
    fwd_kernel(__grid_constant__ const FwdKernelParams params) {
#if defined(__CUDA_ARCH__)
  fwd_block<typename FwdTraitsFor<Element, kHeadDim, FLASHCUTE_AMPERE_TILE_ARCH>::type>(params);
#endif
}

}  // namespace flashcute::ampere
