// The Hopper-path backward's last pass: dQ = softmax_scale · dq_accum, converted to the
// output dtype. dq_accum holds each query block's partials in the consumers' register order
// (see bwd_consumer.h); the same TiledMma partition maps them back to (row, column), through
// shared memory to 16-byte stores. One CTA per (query block, slot of the chunk), 128 threads
// per dQ region (the part of the block one consumer computes).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "kernel_params.h"

namespace flashcute::hopper {

template <class Traits>
__global__ void __launch_bounds__(128 * Traits::kDqRegions)
    bwd_convert_dq_kernel(__grid_constant__ const BwdKernelParams params, int pair_begin) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  const int m_block = blockIdx.x;
  const int slot = blockIdx.y;
  const int pair = pair_begin + slot / params.heads_per_kv;
  const int batch = pair / params.nheads_kv;
  const int head = (pair % params.nheads_kv) * params.heads_per_kv + slot % params.heads_per_kv;
  const int region = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;

  // The block's dQ goes through shared memory as (row, column), so that global memory sees
  // 16-byte row-contiguous stores (the API requires dq 16-byte aligned with such strides).
  // Rows padded by 16 bytes: the quad-of-threads pair writes below then hit distinct banks.
  constexpr int kRowElems = kHeadDim + 16 / int(sizeof(Element));
  __shared__ alignas(16) uint16_t tile_storage[kBlockM * kRowElems];
  Element* tile = reinterpret_cast<Element*>(tile_storage);
  static_assert(sizeof(Element) == sizeof(uint16_t));

  typename Traits::TiledMmaDq mma_dq;
  Tensor coords = mma_dq.get_thread_slice(tid).partition_C(make_identity_tensor(typename Traits::TileDq{}));
  const float* src = params.dq_accum + (int64_t(slot) * params.seqlen_q_padded + m_block * kBlockM) * kHeadDim +
                     region * Traits::kDqElems;
  cutlass::NumericArrayConverter<Element, float, 2> convert;
  // Thread tid's values i..i+3 sit at [i * 128 + tid * 4]: (row, col), (row, col + 1) and the
  // same two columns eight rows down.
  static_assert(size(decltype(coords){}) % 4 == 0);
  CUTE_UNROLL
  for (int i = 0; i < size(coords); i += 4) {
    const float4 values = *reinterpret_cast<const float4*>(src + (i * 128 + tid * 4));
    const float quad[4] = {values.x, values.y, values.z, values.w};
    CUTE_UNROLL
    for (int j = 0; j < 4; j += 2) {  // j, j + 1: adjacent columns of one row
      const int row = (Traits::kDqSplitRows ? region * Traits::kDqRows : 0) + get<0>(coords(i + j));
      const int col = (Traits::kDqSplitCols ? region * Traits::kDqCols : 0) + get<1>(coords(i + j));
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
  Element* dq = static_cast<Element*>(params.dq) + batch * params.dq_batch_stride + head * params.dq_head_stride;
  const int rows = min(kBlockM, params.seqlen_q - m_block * kBlockM);
  for (int idx = threadIdx.x; idx < rows * kChunksPerRow; idx += blockDim.x) {
    const int row = idx / kChunksPerRow;
    const int chunk = idx % kChunksPerRow;
    *reinterpret_cast<uint4*>(dq + int64_t(m_block * kBlockM + row) * params.dq_row_stride + chunk * kChunkElems) =
        *reinterpret_cast<const uint4*>(tile + row * kRowElems + chunk * kChunkElems);
  }
#endif
}

}  // namespace flashcute::hopper
