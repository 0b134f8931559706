// Row-wise passes around the backward's main kernel, both memory-bound:
//  - bwd_prepare: row_dot = rowsum(dO∘O) per (batch, head, query row), and dq_accum zeroed
//    (so no memset is needed: everything runs on the caller's stream as kernels);
//  - bwd_finish_dq: dQ = softmax_scale · dq_accum, converted to the input dtype.
// A group of kLanes threads owns one row, 8 elements (16 bytes of fp16/bf16) per thread.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "kernel_params.h"

namespace flashcute::ampere {

template <int kHeadDim>
struct RowwiseShape {
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kLanes = kChunks <= 4 ? 4 : kChunks <= 8 ? 8 : kChunks <= 16 ? 16 : 32;
  static constexpr int kThreads = 128;
  static constexpr int kRowsPerBlock = kThreads / kLanes;
  static_assert(kHeadDim % 8 == 0 && kChunks <= 32);
};

template <class Element, int kHeadDim>
__global__ void __launch_bounds__(RowwiseShape<kHeadDim>::kThreads)
    bwd_prepare_kernel(__grid_constant__ const BwdKernelParams params) {
  using Shape = RowwiseShape<kHeadDim>;
  const int lane = threadIdx.x % Shape::kLanes;
  const int row = blockIdx.x * Shape::kRowsPerBlock + threadIdx.x / Shape::kLanes;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int col = lane * 8;
  const bool active = lane < Shape::kChunks;

  float dot = 0.f;
  if (active && row < params.seqlen_q) {
    const auto* o = static_cast<const Element*>(params.out) + batch * params.out_batch_stride +
                    head * params.out_head_stride + int64_t(row) * params.out_row_stride + col;
    const auto* d = static_cast<const Element*>(params.dout) + batch * params.dout_batch_stride +
                    head * params.dout_head_stride + int64_t(row) * params.dout_row_stride + col;
    const auto o8 = *reinterpret_cast<const cutlass::Array<Element, 8>*>(o);
    const auto d8 = *reinterpret_cast<const cutlass::Array<Element, 8>*>(d);
    CUTE_UNROLL
    for (int i = 0; i < 8; ++i) dot += float(o8[i]) * float(d8[i]);
  }
  CUTE_UNROLL
  for (int offset = Shape::kLanes / 2; offset > 0; offset /= 2)
    dot += __shfl_xor_sync(0xffffffff, dot, offset);
  if (row >= params.seqlen_q_padded) return;

  const int64_t bh_row = (int64_t(batch) * params.nheads + head) * params.seqlen_q_padded + row;
  if (lane == 0) params.row_dot[bh_row] = dot;
  if (active) {
    float4* acc = reinterpret_cast<float4*>(params.dq_accum + bh_row * kHeadDim + col);
    acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

template <class Element, int kHeadDim>
__global__ void __launch_bounds__(RowwiseShape<kHeadDim>::kThreads)
    bwd_finish_dq_kernel(__grid_constant__ const BwdKernelParams params) {
  using Shape = RowwiseShape<kHeadDim>;
  const int lane = threadIdx.x % Shape::kLanes;
  const int row = blockIdx.x * Shape::kRowsPerBlock + threadIdx.x / Shape::kLanes;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int col = lane * 8;
  if (lane >= Shape::kChunks || row >= params.seqlen_q) return;

  const int64_t bh_row = (int64_t(batch) * params.nheads + head) * params.seqlen_q_padded + row;
  const float4* acc = reinterpret_cast<const float4*>(params.dq_accum + bh_row * kHeadDim + col);
  const float4 lo = acc[0], hi = acc[1];
  cutlass::Array<float, 8> values{};
  values[0] = lo.x, values[1] = lo.y, values[2] = lo.z, values[3] = lo.w;
  values[4] = hi.x, values[5] = hi.y, values[6] = hi.z, values[7] = hi.w;
  CUTE_UNROLL
  for (int i = 0; i < 8; ++i) values[i] *= params.softmax_scale;
  cutlass::NumericArrayConverter<Element, float, 8> convert;
  auto* dq = static_cast<Element*>(params.dq) + batch * params.dq_batch_stride +
             head * params.dq_head_stride + int64_t(row) * params.dq_row_stride + col;
  *reinterpret_cast<cutlass::Array<Element, 8>*>(dq) = convert(values);
}

}  // namespace flashcute::ampere
