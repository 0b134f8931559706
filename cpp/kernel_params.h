// Arguments of one forward or backward launch, as the kernels read them. Filled on the host
// from the public params after validation; shared by the Ampere and Hopper paths.
#pragma once

#include <cstddef>
#include <cstdint>

#include "page_divisor.h"

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
  // The call's head dim, a multiple of 8 up to the kernel's: only these columns are read and
  // written (kernel columns past it are zero in shared memory). V's and out's: headdim_v below.
  int headdim;

  float softmax_scale;
  float scale_log2;  // softmax_scale * log2(e): scores go through exp2 with one FMA
  bool causal;
  // Mask (mask.h): the window's sides clipped to the call, window_left in [0, seqlen_k] and
  // window_right in [0, seqlen_q]; the clip values leave a side unbounded, causal sets right to 0.
  int window_left, window_right;
  // Score hook (score_hook.h): softcap_in = softmax_scale / softcap, 0 when off, and
  // softcap_out = softcap / softmax_scale; ALiBi's float32 slopes, (batch, nheads) with
  // alibi_batch_stride (0: one row for every batch) or null when off, and alibi_scale =
  // -1 / softmax_scale, which turns a slope into raw-score units.
  float softcap_in, softcap_out;
  const float* __restrict__ alibi_slopes;
  int64_t alibi_batch_stride;
  float alibi_scale;
  // P hook (dropout.h): weights dropped where their 16-bit Philox value is below
  // dropout_threshold = round(dropout_p · 65536), 0 when off; kept ones scaled by
  // dropout_rescale = 1 / (1 - dropout_p). Seed and offset from the scalars, or from the device
  // pair {seed, offset} at dropout_rng_state where it is not null.
  uint32_t dropout_threshold;
  float dropout_rescale;
  uint64_t dropout_seed, dropout_offset;
  const int64_t* __restrict__ dropout_rng_state;
  // Variable-length batches (seq_view.h): null leaves the fixed sizes. With cu_seqlens_q,
  // sequence b's queries are rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of the packed q, out
  // and lse (batch strides 0) and seqlen_q is the longest sequence's length; likewise for keys.
  // seqused_k: sequence b uses only its first seqused_k[b] keys. total_q / total_k: the packed
  // tensors' rows, the bound every offset is clamped to.
  const int* __restrict__ cu_seqlens_q;
  const int* __restrict__ cu_seqlens_k;
  const int* __restrict__ seqused_k;
  int total_q, total_k;
  // Optional: the Hopper path splits its last wave when this holds the bytes
  // plan_fwd_split() asks for (hopper/fwd_split_plan.h).
  void* workspace;
  size_t workspace_bytes;
  // V's and out's head dim (the same as headdim unless the kernel has a V head dim of its own),
  // likewise up to the kernel's. Last, so that the fields before it keep their offsets.
  int headdim_v;
  // KV cache (kv_rows.h, Ampere path). seqused_k_add: keys appended by the call, which sequence
  // b sees after its seqused_k[b] cached ones. page_table (batch, max_pages) with its batch
  // stride: k and v are (num_pages, page_size, heads, d), their batch strides step one page,
  // and key row r of sequence b is row r % page_size of page page_table[b][r / page_size]
  // (clamped into [0, num_pages)); null: k and v are batched as usual.
  int seqused_k_add;
  const int* __restrict__ page_table;
  int64_t page_table_batch_stride;
  PageDivisor page_divisor;  // page_size
  int num_pages;
  // Query heads packed into rows (packed_rows.h): tile row r of K/V head h is query row r / G
  // of query head h·G + r % G, with G = packed_heads (1: none); seqlen_q, nheads and
  // heads_per_kv are then the packed call's.
  int packed_heads;
  // Split-KV (split_kv.h): num_splits CTAs share a query tile's key blocks; each leaves its
  // normalized fp32 output and LSE in partial_o / partial_lse for merge_states to combine.
  // Their rows per query head (split_kv.h), query heads and row width: batch · seqlen_q or
  // total_q, the call's nheads (unpacked) and headdim_v.
  int num_splits;
  float* __restrict__ partial_o;
  float* __restrict__ partial_lse;
  int64_t partial_rows;
  int partial_heads;
  // FP8 descales (hopper/fwd_fp8_scales.h), float32, null: 1. An element's value is its e4m3
  // value times its descale. q's is at batch · q_descale_batch_stride + (head /
  // q_descale_head_div) · head_stride + (row / kFp8Block) · block_stride; k's and v's by K/V
  // head and key row alike. Block strides of 0: one descale per (batch, head).
  const float* __restrict__ q_descale;
  const float* __restrict__ k_descale;
  const float* __restrict__ v_descale;
  int64_t q_descale_batch_stride, q_descale_head_stride, q_descale_block_stride;
  int64_t k_descale_batch_stride, k_descale_head_stride, k_descale_block_stride;
  int64_t v_descale_batch_stride, v_descale_head_stride, v_descale_block_stride;
  int q_descale_head_div;  // 1: per query head; heads_per_kv: per K/V head
  bool out_fp16;           // FP8 kernels (bfloat16 O): write float16 bits instead
  // Hopper path: launched as the programmatic dependent of the page copy before it (kv_gather.h),
  // so its CTAs start while the copy ends; the producer waits for the copy before its first load.
  bool after_kv_copy;
  // Hopper path, variable-length batches and windows with a left side: an int of the caller's
  // workspace through which CTAs claim their tiles (hopper/tile_scheduler.h; the launch zeroes
  // it); null: a fixed order.
  int* tile_claims;
};

// Rows (queries or keys) per FP8 descale block.
constexpr int kFp8Block = 128;

// Backward: dQ, dK, dV from dO, the forward's inputs, its output and its LSE. The workspace
// holds rowsum(dO∘O) (row_dot) per (batch, head), padded to seqlen_q_padded rows; the Hopper
// path adds the LSE in log2 units, and both paths an fp32 dQ accumulator unless the call is
// deterministic (see bwd_workspace.h).
struct BwdKernelParams {
  const void* __restrict__ q;
  const void* __restrict__ k;
  const void* __restrict__ v;
  const void* __restrict__ out;
  const void* __restrict__ dout;
  const float* __restrict__ lse;
  void* __restrict__ dq;
  void* __restrict__ dk;
  void* __restrict__ dv;
  float* __restrict__ row_dot;   // (batch, nheads, seqlen_q_padded)
  float* __restrict__ lse_log2;  // like row_dot, or null; +inf on rows no key may reach
  float* __restrict__ dq_accum;  // null: the Ampere path's deterministic design
  // (chunk pairs) or null: the dK/dV CTAs of each (batch, kv head) pair done adding dQ (Hopper
  // path; the dQ conversion waits for them instead of for the whole kernel)
  int* __restrict__ dq_ready;
  // Hopper path without a causal or window band: room for split_tiles_max split tiles of the last wave
  // (bwd_tail_split.h): parts done per tile and their fp32 dK, dV sums; null where none.
  int* __restrict__ split_done;
  float* __restrict__ dkv_accum;
  int split_tiles_max;

  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t out_batch_stride, out_row_stride, out_head_stride;
  int64_t dout_batch_stride, dout_row_stride, dout_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
  int64_t lse_batch_stride, lse_head_stride;

  // headdim: the call's, a multiple of 8 up to the kernel's (as in FwdKernelParams).
  int batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim;
  int heads_per_kv;
  int seqlen_q_padded;

  float softmax_scale;
  float scale_log2;
  bool causal;
  // Mask (mask.h): the window's sides clipped to the call, window_left in [0, seqlen_k] and
  // window_right in [0, seqlen_q]; the clip values leave a side unbounded, causal sets right to 0.
  int window_left, window_right;
  // Score hook (score_hook.h): softcap_in = softmax_scale / softcap, 0 when off, and
  // softcap_out = softcap / softmax_scale; ALiBi's float32 slopes, (batch, nheads) with
  // alibi_batch_stride (0: one row for every batch) or null when off, and alibi_scale =
  // -1 / softmax_scale, which turns a slope into raw-score units.
  float softcap_in, softcap_out;
  const float* __restrict__ alibi_slopes;
  int64_t alibi_batch_stride;
  float alibi_scale;
  // P hook (dropout.h): weights dropped where their 16-bit Philox value is below
  // dropout_threshold = round(dropout_p · 65536), 0 when off; kept ones scaled by
  // dropout_rescale = 1 / (1 - dropout_p). Seed and offset from the scalars, or from the device
  // pair {seed, offset} at dropout_rng_state where it is not null.
  uint32_t dropout_threshold;
  float dropout_rescale;
  uint64_t dropout_seed, dropout_offset;
  const int64_t* __restrict__ dropout_rng_state;
  // Variable-length batches, as in FwdKernelParams (seq_view.h). The workspace keeps
  // seqlen_q_padded rows per (batch, head) whatever the layout of q: sequence b's row r is
  // workspace row r of batch b.
  const int* __restrict__ cu_seqlens_q;
  const int* __restrict__ cu_seqlens_k;
  const int* __restrict__ seqused_k;
  int total_q, total_k;
  // V's, out's, dout's and dv's head dim (as in FwdKernelParams), after the fields above.
  int headdim_v;
  int seqused_k_add;  // as in FwdKernelParams; 0 for a backward
};

// Whether the mask bounds keys by more than seqlen_k (causal diagonal or window): per-tile work
// then varies, which the launchers' schedules take into account.
template <class KernelParams>
inline bool has_band(const KernelParams& p) {
  return p.window_left < p.seqlen_k || p.window_right < p.seqlen_q;
}

}  // namespace flashcute
