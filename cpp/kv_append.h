// Appending new keys and values to a KV cache in place: row i of k_new/v_new for sequence b
// goes to cache row cache_seqlens[b] + i (through the page table where the cache is paged,
// kv_rows.h), before the attention of the same call reads the cache.
//
// cache_seqlens and the page ids are the caller's data, not checked on the host: a row whose
// position falls outside [0, capacity) or whose page id outside [0, num_pages) is not written,
// so no value makes the kernel write outside the caches.
#pragma once

#include <cstdint>

namespace flashcute {

struct KvAppendParams {
  const void* k_new;
  const void* v_new;
  void* k_cache;
  void* v_cache;
  int64_t k_new_batch_stride, k_new_row_stride, k_new_head_stride;
  int64_t v_new_batch_stride, v_new_row_stride, v_new_head_stride;
  // Batched caches: batch strides step a sequence; paged: they step a page.
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  const int* cache_seqlens;
  const int* page_table;  // null: batched caches
  int64_t page_table_batch_stride;
  int page_size, num_pages;
  int capacity;  // rows a sequence's cache holds: seqlen_cache, or max_pages · page_size
  int batch, seqlen_new, heads_kv, headdim, headdim_v;
  int elem_bytes;  // 2
};

}  // namespace flashcute
