// Copying a paged KV cache's used rows into a contiguous workspace before a prefill: the Hopper
// path's TMA loads then read whole key blocks in one box each, where pages shorter than a block
// would cost one box per page slice (paged_kernels.h; the policy is dispatch_policy.h's
// kvcache_copies_pages). Row r of sequence b goes to workspace row (b, r), for r below the
// sequence's used keys, clamped as seq_view.h clamps them; later rows are left as they are
// (the forward masks them and zeroes their V rows).
//
// Page ids and lengths are the caller's data: ids are clamped into [0, num_pages) as the paged
// loads clamp them (kv_rows.h), lengths into [0, capacity), so no value makes the copy leave
// the caches, the table or the workspace.
#pragma once

#include <cstdint>

#include "page_divisor.h"

namespace flashcute {

struct KvGatherParams {
  const void* k_cache;  // (num_pages, page_size, heads_kv, headdim), strides below
  const void* v_cache;
  void* k_out;  // (batch, capacity, heads_kv, headdim), contiguous
  void* v_out;  // (batch, capacity, heads_kv, headdim_v), contiguous
  int64_t k_page_stride, k_row_stride, k_head_stride;
  int64_t v_page_stride, v_row_stride, v_head_stride;
  const int* cache_seqlens;
  int seqlen_new;  // keys the call appended (already in the pages): counted as used
  const int* page_table;
  int64_t page_table_batch_stride;
  PageDivisor page_size;
  int num_pages;
  int capacity;  // max_pages · page_size
  int batch, heads_kv, headdim, headdim_v;
  int elem_bytes;  // 2
};

}  // namespace flashcute
