// Arguments of one forward launch, as the kernels read them. Filled on the host from the
// public AttentionForwardParams after validation; shared by the Ampere and Hopper paths.
#pragma once

#include <cstdint>

namespace flashcute {

struct FwdKernelParams {
  const void* __restrict__ q;
  const void* __restrict__ k;
  const void* __restrict__ v;
  void* __restrict__ out;
  float* __restrict__ lse;  // may be null

  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t out_batch_stride, out_row_stride, out_head_stride;
  int64_t lse_batch_stride, lse_head_stride;

  int batch, seqlen_q, seqlen_k, nheads;
  int heads_per_kv;  // nheads / nheads_kv: query heads sharing one K/V head

  float softmax_scale;
  float scale_log2;  // softmax_scale * log2(e): scores go through exp2 with one FMA
  bool causal;
};

}  // namespace flashcute
