// Host-side launch of the Hopper-path backward for one (dtype, head dim), all on the caller's
// stream: the row-wise prepare pass (row_dot, lse_log2), then per chunk of (batch, kv head)
// pairs (bwd_workspace.h): zero dq_ready and dq_accum (and the split tiles' sums), the dK/dV
// kernel, its last wave split where that shortens it (bwd_tail_split.h), the dQ conversion
// (overlapping the dK/dV kernel's last wave).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>

#include <cuda_runtime_api.h>

#include "bwd_dq_convert.h"
#include "bwd_rowwise.h"
#include "bwd_workspace.h"
#include "hopper/bwd_config.h"
#include "hopper/bwd_kernel.h"
#include "hopper/dependent_launch.h"
#include "hopper/fwd_launch.h"  // tma_view
#include "launch_status.h"

namespace flashcute::hopper {

template <class Element, int kHeadDim>
Status run_bwd(const BwdKernelParams& p, cudaStream_t stream) {
  using Traits = BwdTraitsFor<Element, kHeadDim>;
  using ElementQK = typename Traits::ElementQK;
  using ElementV = typename Traits::ElementV;
  using ElementO = typename Traits::ElementO;
  using ElementGrad = typename Traits::ElementGrad;
  static_assert(kBwdRowPadding % Traits::kBlockM == 0);
  // The key-split kernels whose dQ needs both consumers' dS (hd 64, 128) issue dQ one block
  // late where a CTA loops over enough query blocks (bwd_consumer.h). Measured on the H200
  // (in-process A/B against the same kernel without it, bf16, batch·seqlen 16k): hd 64 gains
  // at every loop length (n512 / c512 / n1k / c1k / n2k / c2k / c4k: -1.2 / 0 / -5.2 / -3.4 /
  // -8.1 / -5.9 / -7.3 % time; -9 to -10 % at 8k-16k), so it always defers; hd 128 loses 2-3 %
  // at 8-16 blocks per CTA and defers from 24.
  constexpr bool kCanDeferDq = !Traits::kSplitsHeadDim && !Traits::kDqSplitKeys;
  constexpr int kDeferDqMinBlocks = bwd_defer_dq_min_blocks(kHeadDim);
  const int query_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  const int blocks_per_cta = p.heads_per_kv * (p.causal ? (query_blocks + 1) / 2 : query_blocks);
  const bool fixed = SeqView::fixed(p);  // else a variable-length batch (seq_view.h)
  auto kernel = &bwd_kernel<Traits>;
  if constexpr (kCanDeferDq) {
    // Variable-length calls only where it is not compiled for fixed lengths alone (bwd_config.h).
    if (blocks_per_cta >= kDeferDqMinBlocks && (fixed || !bwd_deferred_dq_fixed_only(kHeadDim)))
      kernel = &bwd_kernel<Traits, true>;
  }
  // The score hook (softcap, ALiBi) and dropout: one variant per head dim, for fixed and
  // variable lengths, with the deferred dQ where the head dim always defers.
  constexpr bool kHookDefersDq = kCanDeferDq && kDeferDqMinBlocks == 0;
  static_assert(!kHookDefersDq || !bwd_deferred_dq_fixed_only(kHeadDim),
                "the hooked kernel takes variable-length calls");
  auto hooked_kernel = &bwd_kernel<Traits, kHookDefersDq, true>;
  if (ScoreHook::of(p).active() || p.dropout_threshold != 0) kernel = hooked_kernel;
  constexpr int kSmem = Traits::kSmemBytes;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return cuda_status(err, "cudaGetDevice");

  constexpr int64_t kMaxStrideElems = (int64_t(1) << 40) / int64_t(sizeof(Element));
  for (int64_t stride : {p.q_row_stride, p.q_head_stride, p.q_batch_stride, p.k_row_stride, p.k_head_stride,
                         p.k_batch_stride, p.v_row_stride, p.v_head_stride, p.v_batch_stride,
                         p.dout_row_stride, p.dout_head_stride, p.dout_batch_stride, p.dk_row_stride,
                         p.dk_head_stride, p.dk_batch_stride, p.dv_row_stride, p.dv_head_stride,
                         p.dv_batch_stride}) {
    if (stride < 0 || stride >= kMaxStrideElems)
      return make_status(StatusCode::kNotSupported,
                         "hopper path backward: strides must be non-negative and below 2^40 bytes for "
                         "TMA (got %lld elements); use backend='ampere'", static_cast<long long>(stride));
  }

  // Per device, once: the kernel's shared-memory limit raised, the SM count read.
  constexpr int kCachedDevices = 64;
  static std::array<std::atomic<bool>, kCachedDevices> prepared{};
  static std::array<std::atomic<int>, kCachedDevices> sm_counts{};
  int sms = device < kCachedDevices ? sm_counts[device].load(std::memory_order_relaxed) : 0;
  if (sms == 0) {
    if (cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); err != cudaSuccess)
      return cuda_status(err, "cudaDeviceGetAttribute (multiprocessor count)");
    if (device < kCachedDevices) sm_counts[device].store(sms, std::memory_order_relaxed);
  }
  if (device >= kCachedDevices || !prepared[device].load(std::memory_order_acquire)) {
    int smem_optin = 0;
    cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (kSmem > smem_optin)
      return make_status(StatusCode::kNotSupported,
                         "hopper path backward, headdim %d: needs %d bytes of shared memory per block, "
                         "the device allows %d", kHeadDim, kSmem, smem_optin);
    cudaError_t err = cudaFuncSetAttribute(&bwd_kernel<Traits>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if constexpr (kCanDeferDq) {
      if (err == cudaSuccess)
        err = cudaFuncSetAttribute(&bwd_kernel<Traits, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    }
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(hooked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return cuda_status(err, "cudaFuncSetAttribute (no sm90a kernel image for this GPU?)");
    if (device < kCachedDevices) prepared[device].store(true, std::memory_order_release);
  }

  const BwdWorkspace workspace = bwd_workspace(p.batch, p.nheads, p.nheads_kv, p.seqlen_q, p.seqlen_k,
                                               kHeadDim, /*lse_log2=*/true, /*dq_accum=*/true,
                                               /*dq_ready=*/true, hopper_bwd_tail_split(has_band(p)));
  // The last wave split (bwd_tail_split.h) where the workspace has room; not in a variable-length
  // batch, whose key blocks' work differs per sequence (seq_view.h).
  const bool varlen = !fixed;
  constexpr bool kCanSplitTail = Traits::kBlockN <= kBwdChunkBlockN;
  const int split_tiles_max = kCanSplitTail && p.split_done != nullptr && !varlen
                                  ? static_cast<int>(std::min<int64_t>(workspace.split_tiles, p.split_tiles_max))
                                  : 0;
  if (p.seqlen_q > 0) {
    using Rows = RowwiseShape<kHeadDim>;
    const dim3 rows_grid((p.seqlen_q_padded + Rows::kRowsPerBlock - 1) / Rows::kRowsPerBlock, p.nheads, p.batch);
    bwd_prepare_kernel<ElementO, kHeadDim><<<rows_grid, Rows::kThreads, 0, stream>>>(p);
  }

  using namespace cute;
  BwdParams<Traits> kp{};
  kp.args = p;
  // Variable-length batches (seq_view.h): a packed side's tensor maps span all its total rows as
  // one batch (the host set its batch strides to 0); sequences are found by their starts.
  const bool packed_q = p.cu_seqlens_q != nullptr, packed_k = p.cu_seqlens_k != nullptr;
  const int q_rows = packed_q ? p.total_q : p.seqlen_q;
  const int k_rows = std::max(packed_k ? p.total_k : p.seqlen_k, 1);  // read only while seqlen_k > 0
  const int k_batches = packed_k ? 1 : p.batch;
  // No queries: the Q/dO descriptors still need a valid shape; no Q tile is ever loaded then.
  const bool no_queries = p.seqlen_q == 0 || q_rows == 0;
  kp.tma_seqlen_q = no_queries ? 1 : q_rows;
  const int q_batches = no_queries ? k_batches : packed_q ? 1 : p.batch;
  const auto* q = static_cast<const ElementQK*>(no_queries ? p.k : p.q);
  const auto* dout = static_cast<const ElementO*>(no_queries ? p.k : p.dout);
  const int64_t q_strides[3] = {no_queries ? p.k_row_stride : p.q_row_stride,
                                no_queries ? p.k_head_stride : p.q_head_stride,
                                no_queries ? p.k_batch_stride : p.q_batch_stride};
  const int64_t do_strides[3] = {no_queries ? p.k_row_stride : p.dout_row_stride,
                                 no_queries ? p.k_head_stride : p.dout_head_stride,
                                 no_queries ? p.k_batch_stride : p.dout_batch_stride};
  const int q_heads = no_queries ? p.nheads_kv : p.nheads;
  auto slayout_q = typename Traits::SmemLayoutQ{}(_, _, _0{});
  auto slayout_kv = typename Traits::SmemLayoutKV{}(_, _, _0{});
  // The tensor maps span the call's head dims: loads fill the kernel's columns past them with
  // zeros (they add nothing to S, dP, dQ), the dK/dV stores clip. V, dO and dV span
  // headdim_v: a call whose V head dim differs runs on a kernel at least as wide as both, its
  // zero columns adding nothing to dP and giving dV columns that are never stored (no
  // queries: dO's map stays within K's columns, never loaded).
  const int headdim = p.headdim;
  const int headdim_v = p.headdim_v;
  const int headdim_do = no_queries ? std::min(headdim_v, headdim) : headdim_v;
  if (p.seqlen_k > 0) {
    kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, tma_view(q, kp.tma_seqlen_q, headdim, q_heads, q_batches, q_strides[0],
                                                       q_strides[1], q_strides[2]),
                             slayout_q, typename Traits::TileQ{}, _1{});
    kp.tma_do = make_tma_copy(SM90_TMA_LOAD{}, tma_view(dout, kp.tma_seqlen_q, headdim_do, q_heads, q_batches,
                                                        do_strides[0], do_strides[1], do_strides[2]),
                              slayout_q, typename Traits::TileQ{}, _1{});
    kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, tma_view(static_cast<const ElementQK*>(p.k), k_rows, headdim,
                                                       p.nheads_kv, k_batches, p.k_row_stride, p.k_head_stride,
                                                       p.k_batch_stride),
                             slayout_kv, typename Traits::TileKV{}, _1{});
    kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, tma_view(static_cast<const ElementV*>(p.v), k_rows, headdim_v,
                                                       p.nheads_kv, k_batches, p.v_row_stride, p.v_head_stride,
                                                       p.v_batch_stride),
                             slayout_kv, typename Traits::TileKV{}, _1{});
    kp.tma_dk = make_tma_copy(SM90_TMA_STORE{}, tma_view(static_cast<ElementGrad*>(p.dk), k_rows, headdim,
                                                         p.nheads_kv, k_batches, p.dk_row_stride, p.dk_head_stride,
                                                         p.dk_batch_stride),
                              slayout_kv, typename Traits::TileKV{}, _1{});
    kp.tma_dv = make_tma_copy(SM90_TMA_STORE{}, tma_view(static_cast<ElementGrad*>(p.dv), k_rows, headdim_v,
                                                         p.nheads_kv, k_batches, p.dv_row_stride, p.dv_head_stride,
                                                         p.dv_batch_stride),
                              slayout_kv, typename Traits::TileKV{}, _1{});
  }

  const int pairs = p.batch * p.nheads_kv;
  const int chunk = static_cast<int>(workspace.chunk_pairs);
  const int key_blocks = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  for (int pair_begin = 0; pair_begin < pairs; pair_begin += chunk) {
    const int count = std::min(chunk, pairs - pair_begin);
    // The conversion's work in dK/dV query blocks: 8192 dQ values (one 64 × 128 or 128 × 64
    // block) took about 0.7 of a block's GEMMs on the H200 (hd 64 and 128, seqlen 2k-16k).
    const double convert_blocks = 0.7 * double(count) * p.heads_per_kv * p.seqlen_q_padded * kHeadDim / 8192.0;
    kp.split = plan_tail_split(key_blocks, key_blocks * count, p.heads_per_kv * query_blocks, sms, split_tiles_max,
                               convert_blocks);
    if (p.causal && !MaskPolicy::of(p).bounds_left() && !varlen) {  // the causal triangle's costs
      const long long pair_bytes =
          (long long)p.heads_per_kv * p.seqlen_q_padded * kHeadDim * (2 * sizeof(Element) + sizeof(float));
      plan_causal_tail(kp.split, count, sms, pair_bytes);
    }
    if (p.seqlen_q > 0) {  // dq_ready and the chunk's dq_accum, contiguous
      const size_t accum_bytes = size_t(count) * p.heads_per_kv * p.seqlen_q_padded * kHeadDim * sizeof(float);
      if (cudaError_t err = cudaMemsetAsync(p.dq_ready, 0, workspace.dq_ready_bytes + accum_bytes, stream);
          err != cudaSuccess)
        return cuda_status(err, "cudaMemsetAsync (dq_accum)");
    }
    if (kp.split.split_tiles > 0) {  // split_done and the split tiles' dK, dV sums, contiguous
      const size_t bytes = workspace.dkv_accum_offset - workspace.split_done_offset +
                           size_t(kp.split.split_tiles) * dkv_accum_tile_bytes(kHeadDim);
      if (cudaError_t err = cudaMemsetAsync(p.split_done, 0, bytes, stream); err != cudaSuccess)
        return cuda_status(err, "cudaMemsetAsync (dkv_accum)");
    }
    kp.pair_begin = pair_begin;
    if (p.seqlen_k > 0) kernel<<<kp.split.ctas(), Traits::kThreads, kSmem, stream>>>(kp);
    if (p.seqlen_q > 0) {
      // Behind the dK/dV kernel as its programmatic dependent (bwd_dq_convert.h, kAwaitAdds).
      if (cudaError_t err = launch_dependent(&bwd_convert_dq_kernel<Traits, true>, dim3(query_blocks, count * p.heads_per_kv),
                                             dim3(Traits::kDqRegionThreads * Traits::kDqRegions), 0, stream,
                                             p.seqlen_k > 0, p, pair_begin, kp.split);
          err != cudaSuccess)
        return cuda_status(err, "hopper backward dQ conversion launch");
    }
  }
  return cuda_status(cudaGetLastError(), "hopper backward launch");
}

}  // namespace flashcute::hopper
