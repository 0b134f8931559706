// The backward's last pass, on both paths: dQ = softmax_scale · dq_accum, converted to the
// output dtype. dq_accum holds each query block's partials in the register order of the GEMM
// that made them; the same TiledMma partition maps them back to (row, column), through
// shared memory to 16-byte stores.
//
// `Layout` (the path's backward traits) names that order: a query block of kBlockM rows is
// kDqRegions regions of kDqElems values, each computed by kDqRegionThreads threads with
// TiledMmaDq over TileDq, the regions side by side in rows (kDqSplitRows) or columns
// (kDqSplitCols). One CTA per (query block, slot of the chunk), one thread per value group.
//
// kAwaitAdds (Hopper path): the kernel runs as the dK/dV kernel's programmatic dependent, so
// its CTAs may start while that grid's last wave still runs; each waits until dq_ready has
// counted every dK/dV CTA of its (batch, kv head) pair (split ones count each part).
//
// Variable-length batches (seq_view.h): dq_accum row r of batch b is the sequence's query row r;
// only the sequence's rows are written (tensor rows q_start + r), and a block past its end exits.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "bwd_tail_split.h"
#include "kernel_params.h"
#include "seq_view.h"

namespace flashcute {

CUTE_DEVICE void await_count(const int* counter, int expected) {
  int value = 0;
  for (int spins = 0;; ++spins) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(counter) : "memory");
    if (value >= expected) return;
    if (spins == (1 << 26)) __trap();  // over 15 s: a count that never comes is a bug, not a wait
    __nanosleep(256);
  }
}

template <class Layout, bool kAwaitAdds = false>
__global__ void __launch_bounds__(Layout::kDqRegionThreads * Layout::kDqRegions)
    bwd_convert_dq_kernel(__grid_constant__ const BwdKernelParams params, int pair_begin, BwdTailSplit split = {}) {
#if defined(__CUDA_ARCH__)
  using namespace cute;
  using Element = typename Layout::Element;
  constexpr int kBlockM = Layout::kBlockM;
  constexpr int kHeadDim = Layout::kHeadDim;
  constexpr int kThreads = Layout::kDqRegionThreads;
  const int m_block = blockIdx.x;
  const int slot = blockIdx.y;
  const int pair = pair_begin + slot / params.heads_per_kv;
  const int batch = pair / params.nheads_kv;
  const int head = (pair % params.nheads_kv) * params.heads_per_kv + slot % params.heads_per_kv;
  const int region = threadIdx.x / kThreads;
  const int tid = threadIdx.x % kThreads;
  const SeqView seq = SeqView::of(params, batch);
  const int rows = min(kBlockM, seq.seqlen_q - m_block * kBlockM);
  if (rows <= 0) return;  // rows of the next sequence: nothing of this one to convert
  if constexpr (kAwaitAdds) {  // every dK/dV CTA of the pair counts itself once
    if (threadIdx.x == 0) {
      const int pair_slot = slot / params.heads_per_kv;
      await_count(params.dq_ready + pair_slot, split.ctas_of_pair(pair_slot));
    }
    __syncthreads();
  }

  // The block's dQ goes through shared memory as (row, column), so that global memory sees
  // 16-byte row-contiguous stores (the API requires dq 16-byte aligned with such strides).
  // Rows padded by 16 bytes: the quad-of-threads pair writes below then hit distinct banks.
  constexpr int kRowElems = kHeadDim + 16 / int(sizeof(Element));
  __shared__ alignas(16) uint16_t tile_storage[kBlockM * kRowElems];
  Element* tile = reinterpret_cast<Element*>(tile_storage);
  static_assert(sizeof(Element) == sizeof(uint16_t));

  typename Layout::TiledMmaDq mma_dq;
  Tensor coords = mma_dq.get_thread_slice(tid).partition_C(make_identity_tensor(typename Layout::TileDq{}));
  const float* src = params.dq_accum + (int64_t(slot) * params.seqlen_q_padded + m_block * kBlockM) * kHeadDim +
                     region * Layout::kDqElems;
  cutlass::NumericArrayConverter<Element, float, 2> convert;
  // Thread tid's values i..i+3 sit at [i * kThreads + tid * 4]: (row, col), (row, col + 1)
  // and the same two columns eight rows down (the C fragment of a 16 x 8 MMA or a WGMMA).
  static_assert(size(decltype(coords){}) % 4 == 0);
  CUTE_UNROLL
  for (int i = 0; i < size(coords); i += 4) {
    const float4 values = __ldcg(reinterpret_cast<const float4*>(src + (i * kThreads + tid * 4)));  // from L2
    const float quad[4] = {values.x, values.y, values.z, values.w};
    CUTE_UNROLL
    for (int j = 0; j < 4; j += 2) {  // j, j + 1: adjacent columns of one row
      const int row = (Layout::kDqSplitRows ? region * Layout::kDqRows : 0) + get<0>(coords(i + j));
      const int col = (Layout::kDqSplitCols ? region * Layout::kDqCols : 0) + get<1>(coords(i + j));
      cutlass::Array<float, 2> pair_values;
      pair_values[0] = quad[j] * params.softmax_scale;
      pair_values[1] = quad[j + 1] * params.softmax_scale;
      *reinterpret_cast<cutlass::Array<Element, 2>*>(tile + row * kRowElems + col) = convert(pair_values);
    }
  }
  __syncthreads();

  constexpr int kChunkElems = 16 / int(sizeof(Element));
  constexpr int kChunksPerRow = kHeadDim / kChunkElems;
  static_assert(kHeadDim % kChunkElems == 0);
  Element* dq = static_cast<Element*>(params.dq) + batch * params.dq_batch_stride + head * params.dq_head_stride +
                int64_t(seq.q_start) * params.dq_row_stride;
  for (int idx = threadIdx.x; idx < rows * kChunksPerRow; idx += blockDim.x) {
    const int row = idx / kChunksPerRow;
    const int chunk = idx % kChunksPerRow;
    if (chunk * kChunkElems >= params.headdim) continue;  // past the call's head dim
    *reinterpret_cast<uint4*>(dq + int64_t(m_block * kBlockM + row) * params.dq_row_stride + chunk * kChunkElems) =
        *reinterpret_cast<const uint4*>(tile + row * kRowElems + chunk * kChunkElems);
  }
#endif
}

}  // namespace flashcute
