// Host-side launch of the Hopper-path forward: TMA descriptors, tile schedule, grid.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <limits>

#include <cuda_runtime_api.h>

#include "hopper/dependent_launch.h"
#include "hopper/fwd_kernel.h"
#include "hopper/fwd_paged_kv.h"
#include "hopper/fwd_split_plan.h"
#include "hopper/fwd_traits.h"
#include "hopper/tensor_map.h"
#include "launch_status.h"

namespace flashcute::hopper {

// Global tensor (seqlen, hd, heads, batch) for a TMA descriptor.
template <class Pointer>
auto tma_view(Pointer ptr, int seqlen, int headdim, int heads, int batch, int64_t row_stride,
              int64_t head_stride, int64_t batch_stride) {
  using namespace cute;
  return make_tensor(make_gmem_ptr(ptr), make_shape(seqlen, headdim, heads, batch),
                     make_stride(row_stride, _1{}, head_stride, batch_stride));
}

// (batch, head) pairs per schedule group.
// - One, so that the units run in head order and the CTAs running at once work on one or two
//   heads, reading each K/V block from DRAM about once while it sits in L2. Without causal, a
//   partial last query tile of every head is moved to the end of the order (TileSchedule).
// - Causal where the query tiles do not fill seqlen_q: groups whose K/V fits in about half of
//   L2, run pair-major (measured faster at hd 64, 512/1k; with the partial tile moved first
//   still 0.8-1.9 % faster at 512-16k).
// Measured on H200 (benchmarks/results/README.md): L2-sized groups read 2.2-2.8x the DRAM
// bytes of cuDNN (hd 128, seqlen 2k: 570 vs 201 MB) and cost up to 0.13 of the ratio to it.
inline int head_group_size(const FwdKernelParams& p, int block_m, int headdim, int element_bytes, int l2_bytes) {
  if (!p.causal || p.seqlen_q % block_m == 0) return 1;
  const int64_t kv_bytes = 2ll * std::max(p.seqlen_k, 1) * headdim * element_bytes;
  const int64_t per_query_head = std::max<int64_t>(1, kv_bytes / p.heads_per_kv);
  const int64_t fit = std::max<int64_t>(1, (l2_bytes / 2) / per_query_head);
  return static_cast<int>(std::min<int64_t>(fit, int64_t(p.nheads) * p.batch));
}

// (batch, head) pairs per group of a window's claimed tiles: as many as hold their window of K/V
// (about left + 2 · block_m keys) in half of L2.
inline int window_group_size(const FwdKernelParams& p, int block_m, int headdim, int element_bytes, int l2_bytes) {
  const int64_t span = std::min<int64_t>(std::max(p.seqlen_k, 1), int64_t(p.window_left) + 2 * block_m);
  const int64_t per_query_head = std::max<int64_t>(1, 2 * span * headdim * element_bytes / p.heads_per_kv);
  const int64_t fit = std::max<int64_t>(1, (l2_bytes / 2) / per_query_head);
  return static_cast<int>(std::min<int64_t>(fit, int64_t(p.nheads) * p.batch));
}

// Packed query heads (fwd_packed_heads.h): a tensor map of Q or O as (head dim, G heads of a
// group, seqlen_q, K/V head, batch) with boxes of (64 columns, G, 64 / G rows), swizzled as the
// unpacked boxes are.
template <class Element>
Status encode_packed_rows(cute::TmaDescriptor* map, const void* ptr, int headdim, int group, int seqlen, int kv_heads,
                          int batch, int64_t row_stride, int64_t head_stride, int64_t batch_stride) {
  const int64_t extents[5] = {headdim, group, seqlen, kv_heads, batch};
  const int64_t strides[4] = {head_stride, row_stride, head_stride * group, batch_stride};
  const uint32_t box[5] = {64, uint32_t(group), uint32_t(64 / group), 1, 1};
  return encode_swizzled_map<Element>(map, ptr, extents, strides, box, "packed query heads");
}

template <class Element, int kHeadDim, bool kSecondTile, int kHeadDimV, bool kClaimVariant = false>
Status run_fwd_tiles(const FwdKernelParams& call, cudaStream_t stream) {
  using Traits = FwdTraitsFor<Element, kHeadDim, kSecondTile, kHeadDimV, kClaimVariant>;
  using ElementQK = typename Traits::ElementQK;
  using ElementV = typename Traits::ElementV;
  using ElementO = typename Traits::ElementO;
  // The kernel runs the packed call where query heads are packed; Q and O keep the caller's shapes.
  // Not with 8-bit inputs, whose Q descale may differ per query head.
  const int packed = Traits::kTransposesV ? 1 : fwd_packed_heads(call, kHeadDim, Traits::kBlockM, kHeadDimV);
  const FwdKernelParams p = fwd_packed_view(call, packed);
  auto kernel = &fwd_kernel<Traits>;
  constexpr int kSmem = Traits::kSmemBytes;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return cuda_status(err, "cudaGetDevice");

  // TMA: strides in bytes below 2^40 (the 16-byte multiple is checked by the API).
  constexpr int64_t kMaxStrideElems = (int64_t(1) << 40) / int64_t(sizeof(Element));
  for (int64_t stride : {p.q_row_stride, p.q_head_stride, p.q_batch_stride, p.k_row_stride, p.k_head_stride,
                         p.k_batch_stride, p.v_row_stride, p.v_head_stride, p.v_batch_stride,
                         p.out_row_stride, p.out_head_stride, p.out_batch_stride}) {
    if (stride < 0 || stride >= kMaxStrideElems)
      return make_status(StatusCode::kNotSupported,
                         "hopper path: strides must be non-negative and below 2^40 bytes for TMA "
                         "(got %lld elements); use backend='ampere'", static_cast<long long>(stride));
  }

  // Per device, resolved on the first launch and cached: SM count and L2 size, after the
  // kernel's shared-memory limit was raised.
  constexpr int kCachedDevices = 64;
  static std::array<std::atomic<int>, kCachedDevices> sm_counts{};
  static std::array<std::atomic<int>, kCachedDevices> l2_sizes{};
  int sm_count = device < kCachedDevices ? sm_counts[device].load(std::memory_order_acquire) : 0;
  int l2_bytes = device < kCachedDevices ? l2_sizes[device].load(std::memory_order_relaxed) : 0;
  if (sm_count == 0) {
    int smem_optin = 0;
    cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (kSmem > smem_optin)
      return make_status(StatusCode::kNotSupported,
                         "hopper path, headdim %d: needs %d bytes of shared memory per block, the "
                         "device allows %d", kHeadDim, kSmem, smem_optin);
    if (cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        err != cudaSuccess)
      return cuda_status(err, "cudaFuncSetAttribute (no sm90a kernel image for this GPU?)");
    cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
    cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device);
    if (sm_count <= 0) return make_status(StatusCode::kCudaError, "could not query the SM count");
    if (device < kCachedDevices) {
      l2_sizes[device].store(l2_bytes, std::memory_order_relaxed);
      sm_counts[device].store(sm_count, std::memory_order_release);
    }
  }

  using namespace cute;
  FwdParams<Traits> kp{};
  kp.args = p;
  // Variable-length batches (seq_view.h): a packed side's tensor map spans all its total rows
  // as one batch (the host set its batch strides to 0); sequences are found by their starts.
  const bool packed_q = p.cu_seqlens_q != nullptr, packed_k = p.cu_seqlens_k != nullptr;
  const int q_rows = std::max(packed_q ? p.total_q : call.seqlen_q, 1);
  const int q_batches = packed_q ? 1 : p.batch;
  // No keys: the K/V descriptors still need a valid shape; no K/V tile is ever loaded then.
  // A paged cache (kv_rows.h): its maps span (page_size rows, page) where a batch's would span
  // (seqlen_k, batch); loads go through the paged maps below.
  const bool paged = p.page_table != nullptr;
  const int k_rows = packed_k ? p.total_k : paged ? p.page_divisor.divisor : p.seqlen_k;
  const bool no_keys = p.seqlen_k == 0 || k_rows == 0;
  kp.tma_seqlen_k = no_keys ? 1 : k_rows;
  const int k_batches = no_keys ? q_batches : packed_k ? 1 : paged ? p.num_pages : p.batch;
  const auto* q = static_cast<const ElementQK*>(p.q);
  const auto* k = no_keys ? q : static_cast<const ElementQK*>(p.k);
  // No keys: V's map then spans Q's rows (never loaded), as K's does.
  const auto* v = no_keys ? reinterpret_cast<const ElementV*>(q) : static_cast<const ElementV*>(p.v);
  const int64_t k_strides[3] = {no_keys ? p.q_row_stride : p.k_row_stride,
                                no_keys ? p.q_head_stride : p.k_head_stride,
                                no_keys ? p.q_batch_stride : p.k_batch_stride};
  const int64_t v_strides[3] = {no_keys ? p.q_row_stride : p.v_row_stride,
                                no_keys ? p.q_head_stride : p.v_head_stride,
                                no_keys ? p.q_batch_stride : p.v_batch_stride};
  const int kv_heads = no_keys ? p.nheads : p.nheads / p.heads_per_kv;
  kp.nheads_kv = kv_heads;
  auto slayout_q = typename Traits::SmemLayoutQ{}(_, _, _0{});
  auto slayout_k = typename Traits::SmemLayoutK{}(_, _, _0{});
  auto slayout_v = typename Traits::SmemLayoutV{}(_, _, _0{});
  auto slayout_o = typename Traits::SmemLayoutO{}(_, _, _0{});
  // The tensor maps span the call's head dims: loads fill the kernel's columns past them with
  // zeros (they add nothing to Q·Kᵀ, and give O columns that are never stored), stores clip.
  // V and O span headdim_v (no keys: V's map stays within Q's columns, never loaded).
  const int headdim = p.headdim;
  const int headdim_v = no_keys ? std::min(p.headdim_v, p.headdim) : p.headdim_v;
  kp.tma_q = make_tma_copy(SM90_TMA_LOAD{}, tma_view(q, q_rows, headdim, call.nheads, q_batches,
                                                     p.q_row_stride, p.q_head_stride, p.q_batch_stride),
                           slayout_q, typename Traits::TileQ{}, _1{});
  kp.tma_k = make_tma_copy(SM90_TMA_LOAD{}, tma_view(k, kp.tma_seqlen_k, headdim, kv_heads, k_batches,
                                                     k_strides[0], k_strides[1], k_strides[2]),
                           slayout_k, typename Traits::TileK{}, _1{});
  kp.tma_v = make_tma_copy(SM90_TMA_LOAD{}, tma_view(v, kp.tma_seqlen_k, headdim_v, kv_heads, k_batches,
                                                     v_strides[0], v_strides[1], v_strides[2]),
                           slayout_v, typename Traits::TileV{}, _1{});
  kp.tma_o = make_tma_copy(SM90_TMA_STORE{}, tma_view(static_cast<ElementO*>(p.out), q_rows, p.headdim_v,
                                                      call.nheads, q_batches, p.out_row_stride, p.out_head_stride,
                                                      p.out_batch_stride),
                           slayout_o, typename Traits::TileO{}, _1{});
  if (paged) {
    if constexpr (kReadsPages<Traits>) {
      kp.paged_box_rows = paged_box_rows<Traits::kBlockN>(p.page_divisor.divisor);
      if (kp.paged_box_rows == 0)
        return make_status(StatusCode::kNotSupported, "page_table: the Hopper path needs a page size that is a "
                           "multiple of 16 (got %d)", p.page_divisor.divisor);
      if (Status s = encode_paged_kv<ElementQK>(&kp.tma_k_paged, k, headdim, k_rows, kv_heads, p.num_pages,
                                                 k_strides[0], k_strides[1], k_strides[2], kp.paged_box_rows);
          !s.ok())
        return s;
      if (Status s = encode_paged_kv<ElementV>(&kp.tma_v_paged, v, headdim_v, k_rows, kv_heads, p.num_pages,
                                                v_strides[0], v_strides[1], v_strides[2], kp.paged_box_rows);
          !s.ok())
        return s;
    } else {
      return make_status(StatusCode::kNotSupported, "page_table: the Hopper path reads paged caches on 16-bit "
                         "kernels of head dims that are multiples of 64 (this one: %d, %d)", kHeadDim, kHeadDimV);
    }
  }
  kp.packed_heads = packed;
  if (packed > 1) {
    if (Status s = encode_packed_rows<ElementQK>(&kp.tma_q_packed, q, headdim, packed, call.seqlen_q, kv_heads, p.batch,
                                               p.q_row_stride, p.q_head_stride, p.q_batch_stride);
        !s.ok())
      return s;
    if (Status s = encode_packed_rows<ElementO>(&kp.tma_o_packed, p.out, p.headdim_v, packed, call.seqlen_q, kv_heads,
                                               p.batch, p.out_row_stride, p.out_head_stride, p.out_batch_stride);
        !s.ok())
      return s;
  }

  const int num_m_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  if (int64_t(num_m_blocks) * p.nheads * p.batch > std::numeric_limits<int>::max())
    return make_status(StatusCode::kNotSupported, "hopper path: more than 2^31 query tiles");
  // Claimed tiles (tile_scheduler.h); a window's from the last unit, its query tiles in
  // descending order across groups of heads whose windows of K/V fit in half of L2.
  const bool claimed = Traits::kClaimsTiles && fwd_claims_tiles(p);
  const bool reversed = claimed && fwd_windowed(p);
  const int group_size = reversed ? window_group_size(p, Traits::kBlockM, p.headdim, sizeof(Element), l2_bytes)
                                  : head_group_size(p, Traits::kBlockM, p.headdim, sizeof(Element), l2_bytes);
  const bool partial_last_tile = p.seqlen_q % Traits::kBlockM != 0;
  // Causal: the query tiles start up to kBlockM - 64 rows before row 0, in whole consumer blocks,
  // so that the consumers a partial tile leaves idle sit in the first tile (the fewest keys), not
  // the last (the most). TMA boxes then start at row 0 or later, or are skipped.
  const int missing_rows = partial_last_tile ? Traits::kBlockM - p.seqlen_q % Traits::kBlockM : 0;
  // Pairs balance the causal triangle; a window's tiles cost about the same each. Packed
  // queries (cu_seqlens_q) pair and shift each sequence's own tiles (seq_tile, fwd_params.h);
  // row_shift is then the longest sequence's, unused.
  const bool paired = p.causal && !MaskPolicy::of(p).bounds_left();
  kp.row_shift = paired ? missing_rows / Traits::kRowsPerConsumer * Traits::kRowsPerConsumer : 0;
  kp.schedule = TileSchedule::make(num_m_blocks, p.nheads, p.batch, group_size, paired, partial_last_tile && !reversed);
  int grid = std::min(kp.schedule.num_units, sm_count);

  // The last wave shared by all CTAs, where it pays and the caller gave the workspace for it.
  static_assert(Traits::kTransposesV || (fwd_tile_size(kHeadDim, kSecondTile).consumers == Traits::kConsumers &&
                                          fwd_tile_size(kHeadDim, kSecondTile).block_n == Traits::kBlockN));
  // 8-bit calls never split (their workspace size is 0): a piece's state would need its descales.
  const FwdSplitPlan split = Traits::kTransposesV ? FwdSplitPlan{} : plan_fwd_split(call, kHeadDim, sm_count, kHeadDimV);
  int* counts = nullptr;  // counts that must be zero at launch: the split tiles', or the tile claims
  size_t count_bytes = 0;
  if (split.split.tiles > 0 && p.workspace != nullptr && p.workspace_bytes >= split.workspace.bytes) {
    kp.schedule.split = split.split;
    kp.split_count = static_cast<int*>(p.workspace);
    kp.split_state = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + split.workspace.count_bytes);
    grid = split.split.ctas;
    counts = kp.split_count, count_bytes = split.workspace.count_bytes;
  } else if (claimed) {
    kp.schedule.claims = p.tile_claims;
    kp.schedule.reversed = reversed;
    counts = p.tile_claims, count_bytes = sizeof(int);
  }
  if (counts != nullptr) {
    // The counts must be zero before the kernel counts. Under CUDA-graph capture a small
    // kernel zeroes them and the forward kernel runs as its programmatic dependent, so the
    // zeroing overlaps the first key blocks (H200, split decoding calls replayed from graphs:
    // 0.3-1.0 us less per call). Launched eagerly, that costs the host a second kernel launch
    // for nothing (the zeroing is done long before the forward kernel is launched; measured
    // 1-5 us more per synchronized call), so a memset does it there.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaError_t err = cudaStreamIsCapturing(stream, &capture); err != cudaSuccess)
      return cuda_status(err, "cudaStreamIsCapturing");
    if (capture == cudaStreamCaptureStatusActive) {
      constexpr int kZeroThreads = 32;
      fwd_zero_counts<kZeroThreads><<<1, kZeroThreads, 0, stream>>>(counts, static_cast<int>(count_bytes / sizeof(int)));
      if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return cuda_status(err, "zeroing launch");
      return cuda_status(launch_dependent(kernel, dim3(grid), dim3(Traits::kThreads), kSmem, stream, true, kp),
                         "hopper forward launch");
    }
    if (cudaError_t err = cudaMemsetAsync(counts, 0, count_bytes, stream); err != cudaSuccess)
      return cuda_status(err, "cudaMemsetAsync (forward counts)");
  }
  if (p.after_kv_copy)
    return cuda_status(launch_dependent(kernel, dim3(grid), dim3(Traits::kThreads), kSmem, stream, true, kp),
                       "hopper forward launch");
  kernel<<<grid, Traits::kThreads, kSmem, stream>>>(kp);
  return cuda_status(cudaGetLastError(), "hopper forward launch");
}

// A head dim's launcher: its second tile where it has one and the call asks for it (hd 64: short
// causal calls; fwd_config.h), else its tile. The split plan and the host's workspace size make
// the same choice through fwd_second_tile.
// kHeadDimV: V's and O's head dim where it differs (a (head dim, V head dim) pair kernel).
template <class Element, int kHeadDim, int kHeadDimV = kHeadDim>
Status run_fwd(const FwdKernelParams& p, cudaStream_t stream) {
  if constexpr (kFwdClaimVariant<kHeadDim> && !kIsFp8<Element>) {  // claimed tiles: their kernel (fwd_traits.h)
    if (fwd_claims_tiles(p)) return run_fwd_tiles<Element, kHeadDim, false, kHeadDimV, true>(p, stream);
  }
  if constexpr (fwd_has_second_tile(kHeadDim) && kHeadDimV == kHeadDim && !kIsFp8<Element>) {
    if (fwd_second_tile(kHeadDim, p.seqlen_q, p.seqlen_k, p.causal))
      return run_fwd_tiles<Element, kHeadDim, true, kHeadDimV>(p, stream);
  }
  return run_fwd_tiles<Element, kHeadDim, false, kHeadDimV>(p, stream);
}

}  // namespace flashcute::hopper
