// The backward's row-wise prepare pass (memory-bound): row_dot = rowsum(dO∘O) per (batch,
// head, query row), the softmax term of dS = P∘(dP - row_dot); padding rows get 0. Where the
// kernel reads whole padded blocks of rows (Hopper path), it also writes the LSE in log2 units,
// +inf on padding rows and rows that saw no key, so that P = exp2(S·scale_log2 - lse) is 0 there.
// A group of kLanes threads owns one row, 8 elements (16 bytes of fp16/bf16) per thread.
// Variable-length batches (seq_view.h): workspace row r of batch b is the sequence's query row r
// (tensor row q_start + r); its rows from seqlen_q on are padding.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include "kernel_params.h"
#include "seq_view.h"

namespace flashcute {

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
  const bool active = lane < Shape::kChunks && col < params.headdim_v;  // out's and dout's columns only
  const SeqView seq = SeqView::of(params, batch);
  const int64_t tensor_row = int64_t(seq.q_start) + row;

  float dot = 0.f;
  if (active && row < seq.seqlen_q) {
    const auto* o = static_cast<const Element*>(params.out) + batch * params.out_batch_stride +
                    head * params.out_head_stride + tensor_row * params.out_row_stride + col;
    const auto* d = static_cast<const Element*>(params.dout) + batch * params.dout_batch_stride +
                    head * params.dout_head_stride + tensor_row * params.dout_row_stride + col;
    // One 16-byte load each (rows are 16-byte aligned); Array<Element, 8> alone is only
    // 2-byte aligned and compiles to narrower loads.
    const uint4 o_raw = *reinterpret_cast<const uint4*>(o);
    const uint4 d_raw = *reinterpret_cast<const uint4*>(d);
    const auto& o8 = reinterpret_cast<const cutlass::Array<Element, 8>&>(o_raw);
    const auto& d8 = reinterpret_cast<const cutlass::Array<Element, 8>&>(d_raw);
    CUTE_UNROLL
    for (int i = 0; i < 8; ++i) dot += float(o8[i]) * float(d8[i]);
  }
  CUTE_UNROLL
  for (int offset = Shape::kLanes / 2; offset > 0; offset /= 2)
    dot += __shfl_xor_sync(0xffffffff, dot, offset);
  if (row >= params.seqlen_q_padded) return;

  const int64_t bh_row = (int64_t(batch) * params.nheads + head) * params.seqlen_q_padded + row;
  if (lane == 0) params.row_dot[bh_row] = dot;
  if (lane == 1 && params.lse_log2 != nullptr) {
    constexpr float kLog2e = 1.4426950408889634f;
    const float lse = row < seq.seqlen_q
                          ? params.lse[batch * params.lse_batch_stride + head * params.lse_head_stride + tensor_row]
                          : -INFINITY;
    params.lse_log2[bh_row] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

}  // namespace flashcute
