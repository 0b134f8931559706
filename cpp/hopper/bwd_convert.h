// The Hopper-path backward's last pass: dQ = softmax_scale · dq_accum, converted to the
// output dtype. dq_accum holds each query block's partials in the consumers' register order
// (see bwd_consumer.h); the same TiledMma partition maps them back to (row, column).
// One CTA per (query block, slot of the chunk), 128 threads per dQ column region.
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

  typename Traits::TiledMmaDq mma_dq;
  Tensor coords = mma_dq.get_thread_slice(tid).partition_C(make_identity_tensor(typename Traits::TileDq{}));
  const float* src = params.dq_accum + (int64_t(slot) * params.seqlen_q_padded + m_block * kBlockM) * kHeadDim +
                     region * Traits::kDqElems;
  Element* dq = static_cast<Element*>(params.dq) + batch * params.dq_batch_stride + head * params.dq_head_stride;
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
      const int row = m_block * kBlockM + get<0>(coords(i + j));
      const int col = region * Traits::kDqCols + get<1>(coords(i + j));
      cutlass::Array<float, 2> pair_values;
      pair_values[0] = quad[j] * params.softmax_scale;
      pair_values[1] = quad[j + 1] * params.softmax_scale;
      if (row < params.seqlen_q)
        *reinterpret_cast<cutlass::Array<Element, 2>*>(dq + int64_t(row) * params.dq_row_stride + col) =
            convert(pair_values);
    }
  }
#endif
}

}  // namespace flashcute::hopper
