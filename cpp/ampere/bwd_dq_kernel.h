// Ampere-path backward, dQ for deterministic calls: one CTA per query block walks its key
// blocks in a fixed order and owns its dQ rows outright, so no floating-point atomics are
// involved and gradients are bitwise reproducible. It recomputes S, P and dP (three GEMMs per
// block pair where the main kernel's default design adds dS·K with one GEMM and reductions);
// on an H200 that default measured 1.04-1.34x this pass plus the atomic-free main kernel.
//
// The structure follows the forward kernel: warps split the query rows, K/V stream through a
// two-stage cp.async pipeline, and dS stays in registers as the A operand of dQ += dS·K.
// With dropout (the kHooks variant) dS = P∘(Z·dP / (1 - p) - rowsum(dO∘O)), the keep mask Z
// regenerated from the forward's Philox counters (dropout.h).
// Variable-length batches (seq_view.h) as in the forward: a CTA whose rows start past its
// sequence's end exits, and offsets, lengths and mask come from the sequence's view.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm80.hpp>

#include "ampere/dropout_fragments.h"
#include "ampere/fwd_traits.h"
#include "ampere/smem_gemm.h"
#include "ampere/tile_arch.h"
#include "fragment_views.h"
#include "kernel_params.h"
#include "mask.h"
#include "online_softmax.h"
#include "score_hook.h"
#include "seq_view.h"

namespace flashcute::ampere {

// Shared memory: [Q][dO][stage 0: K, V][stage 1: K, V].
template <class Element, int kHeadDim, int kBlockM, int kBlockN, int kNWarps>
struct BwdDqTraits : FwdTraits<Element, kHeadDim, kBlockM, kBlockN, kNWarps, 2, false> {
  using Base = FwdTraits<Element, kHeadDim, kBlockM, kBlockN, kNWarps, 2, false>;
  static constexpr int kOffsetDO = Base::kQElems;
  static constexpr int kOffsetKV = 2 * Base::kQElems;
  static constexpr int kSmemBytes = (kOffsetKV + 2 * Base::kStageElems) * int(sizeof(Element));
};

// "BlockM, BlockN, Warps" per head dim: sm80 code within 99 KB of shared memory (sm86/89),
// sm90 code as measured on an H200. FLASHCUTE_AMPERE_DQ_TILE (three -D values, M N W) overrides
// the sm90 entry of every head dim, for measurements.
template <int kHeadDim, int kArch>
struct BwdDqTile {
  static constexpr int kM = kHeadDim == 256 ? 32 : 64;
  static constexpr int kN = kHeadDim > 128 ? 32 : 64;
  static constexpr int kWarps = kHeadDim == 256 ? 2 : 4;
};
template <int kHeadDim>
struct BwdDqTile<kHeadDim, 90> {
#if defined(FLASHCUTE_AMPERE_DQ_TILE_M)
  static constexpr int kM = FLASHCUTE_AMPERE_DQ_TILE_M;
  static constexpr int kN = FLASHCUTE_AMPERE_DQ_TILE_N;
  static constexpr int kWarps = FLASHCUTE_AMPERE_DQ_TILE_WARPS;
#else
  static constexpr int kM = kHeadDim == 256 ? 32 : 64;
  static constexpr int kN = kHeadDim > 128 ? 32 : 64;
  static constexpr int kWarps = kHeadDim == 256 ? 2 : 4;
#endif
};

template <class Element, int kHeadDim, int kArch>
struct BwdDqTraitsFor {
  using Tile = BwdDqTile<kHeadDim, kArch>;
  using type = BwdDqTraits<Element, kHeadDim, Tile::kM, Tile::kN, Tile::kWarps>;
};

template <class Traits, bool kHooks>
CUTE_DEVICE void bwd_dq_block(const BwdKernelParams& params) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using TileS = Shape<Int<kBlockM>, Int<kBlockN>>;

  extern __shared__ __align__(128) char smem_raw[];
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  auto smem_k = [&](int stage) { return smem + Traits::kOffsetKV + stage * Traits::kStageElems; };

  const int tid = threadIdx.x;
  const int m_block = params.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / params.heads_per_kv;
  const int row0 = m_block * kBlockM;
  const SeqView seq = SeqView::of(params, batch);
  if (row0 >= seq.seqlen_q) return;  // rows of the next sequence
  const int seqlen_q = seq.seqlen_q;
  const int seqlen_k = seq.seqlen_k;
  // The hook is read from the kernel parameters where used (constant bank operands), not held
  // in registers: the kernels run at the register cap.
  const KeyBlockRange range = key_block_range<kBlockN>(seq.mask(params), row0, kBlockM);
  // A head dim below the kernel's (rounded up to it): the columns past it are zeros in shared
  // memory and neither loaded nor stored (one uniform branch per copy, as in the forward).
  const bool partial_cols = params.headdim < kHeadDim;

  const Element* q_base = static_cast<const Element*>(params.q) + batch * params.q_batch_stride +
                          head * params.q_head_stride + int64_t(seq.q_start + row0) * params.q_row_stride;
  const Element* do_base = static_cast<const Element*>(params.dout) + batch * params.dout_batch_stride +
                           head * params.dout_head_stride + int64_t(seq.q_start + row0) * params.dout_row_stride;
  // Key rows past seqlen_k land as zeros (load_kv's first, partial block): they may hold
  // anything (the next sequence, unused keys past seqused_k), and 0 · NaN would poison dP.
  const Element* k_base = static_cast<const Element*>(params.k) + batch * params.k_batch_stride +
                          kv_head * params.k_head_stride + int64_t(seq.k_start) * params.k_row_stride;
  const Element* v_base = static_cast<const Element*>(params.v) + batch * params.v_batch_stride +
                          kv_head * params.v_head_stride + int64_t(seq.k_start) * params.v_row_stride;

  typename Traits::GmemTiledCopyLoad gmem_copy;
  auto gmem_thr_copy = gmem_copy.get_thread_slice(tid);
  Tensor cQ = gmem_thr_copy.partition_S(make_identity_tensor(TileQ{}));
  Tensor cKV = gmem_thr_copy.partition_S(make_identity_tensor(TileKV{}));
  Tensor sQ = make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(smem + Traits::kOffsetDO), typename Traits::SmemLayoutQ{});

  auto load_kv = [&](int n, int stage, auto may_be_partial) {
    Tensor sK = make_tensor(make_smem_ptr(smem_k(stage)), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem_k(stage) + Traits::kKVElems), typename Traits::SmemLayoutKV{});
    const int64_t row = int64_t(n) * kBlockN;
    Tensor gK = make_tensor(make_gmem_ptr(k_base + row * params.k_row_stride), TileKV{},
                            make_stride(params.k_row_stride, _1{}));
    Tensor gV = make_tensor(make_gmem_ptr(v_base + row * params.v_row_stride), TileKV{},
                            make_stride(params.v_row_stride, _1{}));
    const int valid = seqlen_k - n * kBlockN;
    if (partial_cols) {
      load_tile_cols<decltype(may_be_partial)::value>(gmem_copy, gmem_thr_copy.partition_S(gK),
                                                      gmem_thr_copy.partition_D(sK), cKV, valid, params.headdim);
      load_tile_cols<decltype(may_be_partial)::value>(gmem_copy, gmem_thr_copy.partition_S(gV),
                                                      gmem_thr_copy.partition_D(sV), cKV, valid, params.headdim);
    } else if (decltype(may_be_partial)::value && valid < kBlockN) {
      load_tile<true>(gmem_copy, gmem_thr_copy.partition_S(gK), gmem_thr_copy.partition_D(sK), cKV, valid);
      load_tile<true>(gmem_copy, gmem_thr_copy.partition_S(gV), gmem_thr_copy.partition_D(sV), cKV, valid);
    } else {
      load_tile<false>(gmem_copy, gmem_thr_copy.partition_S(gK), gmem_thr_copy.partition_D(sK), cKV, valid);
      load_tile<false>(gmem_copy, gmem_thr_copy.partition_S(gV), gmem_thr_copy.partition_D(sV), cKV, valid);
    }
  };

  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  auto copy_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto copy_b = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto copy_bt = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  auto thr_copy_a = copy_a.get_thread_slice(tid);
  auto thr_copy_b = copy_b.get_thread_slice(tid);
  auto thr_copy_bt = copy_bt.get_thread_slice(tid);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  Tensor tSsQ = thr_copy_a.partition_S(sQ);
  Tensor tSsdO = thr_copy_a.partition_S(sdO);
  Tensor tSrK = thr_mma.partition_fragment_B(make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutKV{}));
  Tensor tQrKt = thr_mma.partition_fragment_B(make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutVt{}));

  Tensor acc_dq = partition_fragment_C(tiled_mma, TileQ{});
  clear(acc_dq);
  Tensor cS = make_identity_tensor(TileS{});
  Tensor tScS = thr_mma.partition_C(cS);
  Tensor tScS0 = tiled_mma.get_thread_slice(0).partition_C(cS);
  Tensor score_offsets_rc = make_tensor(tScS0.data(), rowcol_layout(tScS0.layout()));
  constexpr int kRows = decltype(size<0>(score_offsets_rc))::value;
  const int thread_row = row0 + get<0>(tScS(0));
  const int thread_col = get<1>(tScS(0));
  const float scale_log2 = params.scale_log2;
  constexpr float kLog2e = 1.4426950408889634f;

  {
    Tensor tQgQ = gmem_thr_copy.partition_S(
        make_tensor(make_gmem_ptr(q_base), TileQ{}, make_stride(params.q_row_stride, _1{})));
    Tensor tQgdO = gmem_thr_copy.partition_S(
        make_tensor(make_gmem_ptr(do_base), TileQ{}, make_stride(params.dout_row_stride, _1{})));
    if (partial_cols) {
      Tensor tQsQ = gmem_thr_copy.partition_D(sQ);
      Tensor tQsdO = gmem_thr_copy.partition_D(sdO);
      clear_tile_cols(tQsQ, cQ, params.headdim);
      clear_tile_cols(tQsdO, cQ, params.headdim);
      load_tile_cols<true>(gmem_copy, tQgQ, tQsQ, cQ, seqlen_q - row0, params.headdim);
      load_tile_cols<true>(gmem_copy, tQgdO, tQsdO, cQ, seqlen_q - row0, params.headdim);
      // Both K/V stages' columns past the head dim, once (smem_gemm.h).
      CUTE_UNROLL
      for (int stage = 0; stage < 2; ++stage) {
        clear_tile_cols(gmem_thr_copy.partition_D(make_tensor(make_smem_ptr(smem_k(stage)),
                                                              typename Traits::SmemLayoutKV{})),
                        cKV, params.headdim);
        clear_tile_cols(gmem_thr_copy.partition_D(make_tensor(make_smem_ptr(smem_k(stage) + Traits::kKVElems),
                                                              typename Traits::SmemLayoutKV{})),
                        cKV, params.headdim);
      }
    } else {
      load_tile<true>(gmem_copy, tQgQ, gmem_thr_copy.partition_D(sQ), cQ, seqlen_q - row0);
      load_tile<true>(gmem_copy, tQgdO, gmem_thr_copy.partition_D(sdO), cQ, seqlen_q - row0);
    }
  }
  if (range.n_end > range.n_begin) load_kv(range.n_end - 1, 0, cute::true_type{});
  cp_async_fence();

  // The rows are fixed for the whole CTA: lse (log2 units, +inf where P must vanish) and
  // rowsum(dO∘O) are read once.
  float lse_log2[kRows], row_dot[kRows];
  {
    const float* lse_base =
        params.lse + batch * params.lse_batch_stride + head * params.lse_head_stride + seq.q_start;
    const float* row_dot_base =
        params.row_dot + (int64_t(batch) * params.nheads + head) * params.seqlen_q_padded;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = thread_row + get<0>(score_offsets_rc(r, 0));
      const float lse = row < seqlen_q ? lse_base[row] : INFINITY;
      lse_log2[r] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      row_dot[r] = row < seqlen_q ? row_dot_base[row] : 0.f;
    }
  }

  int stage = 0;
  // Key blocks from the last: the masked ones (seqlen_k tail, causal diagonal, window sides)
  // come first and last.
  for (int n_block = range.n_end - 1; n_block >= range.n_begin; --n_block) {
    cp_async_wait<0>();
    __syncthreads();  // block n_block landed; every warp is done with the other stage
    if (n_block > range.n_begin) load_kv(n_block - 1, stage ^ 1, cute::false_type{});
    cp_async_fence();

    Tensor sK = make_tensor(make_smem_ptr(smem_k(stage)), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem_k(stage) + Traits::kKVElems), typename Traits::SmemLayoutKV{});
    Tensor sKt = make_tensor(make_smem_ptr(smem_k(stage)), typename Traits::SmemLayoutVt{});

    const int col_base = n_block * kBlockN + thread_col;
    // Dropout's keep bits (kHooks), drawn before S takes its registers (dropout_fragments.h);
    // warps split the rows only, so each thread holds whole groups of dropout.h's bits.
    KeepMaskFor<decltype(score_offsets_rc)> keep;
    if constexpr (kHooks) {
      if (params.dropout_threshold != 0)  // uniform
        keep.template draw<true>(Dropout::of(params), score_offsets_rc, thread_row, col_base,
                                 batch * params.nheads + head);
    }

    Tensor acc_s = partition_fragment_C(tiled_mma, TileS{});
    clear(acc_s);
    gemm_from_smem<false, Traits::kLookaheadK>(acc_s, tSrQ, tSrK, tSsQ, thr_copy_a.retile_D(tSrQ),
                                               thr_copy_b.partition_S(sK), thr_copy_b.retile_D(tSrK),
                                               tiled_mma, copy_a, copy_b);
    Tensor acc_s_rc = rowcol_view(acc_s);
    if (ScoreHook::of(params).softcap()) ScoreHook::of(params).apply_softcap(acc_s);  // uniform
    if (range.needs_mask(n_block))  // warp-uniform
      seq.mask(params).apply(acc_s_rc, score_offsets_rc, thread_row, col_base);
    if constexpr (kHooks) {
      // ALiBi's bias after the mask (a masked -inf stays -inf), in log2 units inside exp2's FMA.
      const float slope_log2 = ScoreHook::of(params).alibi_slope(batch, head) * scale_log2;
      const float base = float(thread_row + seq.mask(params).offset() - col_base);
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(acc_s_rc); ++c) {
          const float bias_log2 = ScoreHook::alibi_bias(slope_log2, base, score_offsets_rc, r, c);
          acc_s_rc(r, c) = fast_exp2(fmaf(acc_s_rc(r, c), scale_log2, bias_log2 - lse_log2[r]));
        }
      }
    } else {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(acc_s_rc); ++c)
          acc_s_rc(r, c) = fast_exp2(fmaf(acc_s_rc(r, c), scale_log2, -lse_log2[r]));
      }
    }

    Tensor acc_dp = partition_fragment_C(tiled_mma, TileS{});
    clear(acc_dp);
    gemm_from_smem<false, Traits::kLookaheadK>(acc_dp, tSrQ, tSrK, tSsdO, thr_copy_a.retile_D(tSrQ),
                                               thr_copy_b.partition_S(sV), thr_copy_b.retile_D(tSrK),
                                               tiled_mma, copy_a, copy_b);
    Tensor acc_dp_rc = rowcol_view(acc_dp);
    if constexpr (kHooks) {
      // Dropout: dS = P∘(Z·dP / (1 - p) - rowsum(dO∘O)), with Z as the forward drew it. Without
      // dropout the rescale is 1.
      if (params.dropout_threshold != 0) keep.apply(acc_dp_rc);  // uniform
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(acc_dp_rc); ++c)
          acc_dp_rc(r, c) = acc_s_rc(r, c) * fmaf(acc_dp_rc(r, c), params.dropout_rescale, -row_dot[r]);
      }
    } else {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(acc_dp_rc); ++c)
          acc_dp_rc(r, c) = acc_s_rc(r, c) * (acc_dp_rc(r, c) - row_dot[r]);
      }
    }
    if (ScoreHook::of(params).softcap()) {  // uniform; ALiBi's bias alone leaves dS as it is
      const ScoreHook hook = ScoreHook::of(params);
      const float slope = kHooks ? hook.alibi_slope(batch, head) : 0.f;
      const float base = float(thread_row + seq.mask(params).offset() - col_base);
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(acc_dp_rc); ++c) {
          const float p = acc_s_rc(r, c), inv_scale_log2 = 1.f / params.scale_log2;
          if constexpr (kHooks)
            acc_dp_rc(r, c) *= hook.grad_factor(p, lse_log2[r], inv_scale_log2,
                                                ScoreHook::alibi_bias(slope, base, score_offsets_rc, r, c));
          else
            acc_dp_rc(r, c) *= hook.grad_factor(p, lse_log2[r], inv_scale_log2);
        }
      }
    }

    // dQ += dS·K: dS from registers, one 16-key slice at a time; Kᵀ by transposed ldmatrix.
    Tensor ds_a = make_tensor(acc_dp.data(), acc_to_a_operand_layout(acc_dp.layout()));
    Tensor tQsKt = thr_copy_bt.partition_S(sKt);
    Tensor tQrKt_view = thr_copy_bt.retile_D(tQrKt);
    CUTE_UNROLL
    for (int k = 0; k < size<2>(ds_a); ++k) {
      copy(copy_bt, tQsKt(_, _, k), tQrKt_view(_, _, k));
      Tensor ds = convert_fragment<Element>(ds_a(_, _, k));
      gemm(tiled_mma, ds, tQrKt(_, _, k), acc_dq);
    }
    stage ^= 1;
  }

  // Epilogue: dQ = scale · acc, through Q's shared memory for 16-byte row stores.
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dq); ++i) acc_dq(i) *= params.softmax_scale;
  Tensor dq = convert_fragment<Element>(acc_dq);
  cp_async_wait<0>();
  __syncthreads();
  auto copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto thr_copy_o = copy_o.get_thread_slice(tid);
  copy(copy_o, thr_copy_o.retile_S(dq), thr_copy_o.partition_D(sQ));
  __syncthreads();

  Element* dq_base = static_cast<Element*>(params.dq) + batch * params.dq_batch_stride +
                     head * params.dq_head_stride + int64_t(seq.q_start + row0) * params.dq_row_stride;
  Tensor gdQ = make_tensor(make_gmem_ptr(dq_base), TileQ{}, make_stride(params.dq_row_stride, _1{}));
  typename Traits::GmemTiledCopyStore gmem_store;
  auto gmem_thr_store = gmem_store.get_thread_slice(tid);
  Tensor tsQ = gmem_thr_store.partition_S(sQ);
  Tensor tgQ = gmem_thr_store.partition_D(gdQ);
  Tensor trQ = make_fragment_like(tsQ);
  copy(gmem_store, tsQ, trQ);
  Tensor tcQ = gmem_thr_store.partition_D(make_identity_tensor(TileQ{}));
  if (partial_cols) {
    store_tile_cols(gmem_store, trQ, tgQ, tcQ, seqlen_q - row0, params.headdim);
    return;
  }
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tgQ); ++m) {
    if (row0 + get<0>(tcQ(0, m, 0)) < seqlen_q) copy(gmem_store, trQ(_, m, _), tgQ(_, m, _));
  }
}

// kHooks: ALiBi and dropout compiled in (softcap is a runtime branch either way); run_bwd
// takes this variant where either is on. ALiBi's code as a runtime branch raised hd 64's count
// from 167 to 203 registers, three CTAs per SM to two; its bias rides in exp2's FMA rather than
// in a pass of its own, which spilled at hd 256. Without slopes the bias is 0, and dropout is a
// uniform branch here.
template <class Element, int kHeadDim, bool kHooks = false>
__global__ void __launch_bounds__(
    BwdDqTraitsFor<Element, kHeadDim, FLASHCUTE_AMPERE_TILE_ARCH>::type::kNThreads, 1)
    bwd_dq_kernel(__grid_constant__ const BwdKernelParams params) {
#if defined(__CUDA_ARCH__)
  if constexpr (compiled_for<kHeadDim, FLASHCUTE_AMPERE_TILE_ARCH>())
    bwd_dq_block<typename BwdDqTraitsFor<Element, kHeadDim, FLASHCUTE_AMPERE_TILE_ARCH>::type, kHooks>(params);
#endif
}

}  // namespace flashcute::ampere
