// Where key row r of a sequence lies in k and v: batched (row r of the sequence's slice) or in a
// paged KV cache (row r % page_size of page page_table[b][r / page_size]). Loads of both paths
// ask this object for a row's offset and never read the page table themselves.
//
// Page ids are the caller's data and are not checked on the host (that would cost a sync):
// clamped into [0, num_pages), no value makes a load leave the cache. Rows are below the
// sequence's clamped length (seq_view.h), at most max_pages · page_size, so the table index
// stays inside the table.
#pragma once

#include <cstdint>

#include <cute/config.hpp>
#include <cute/numeric/math.hpp>  // cute::min, cute::max

#include "page_divisor.h"

namespace flashcute {

// Where one key row lies in k and in v: element offsets from the head's column of the cache.
struct KvRowOffsets {
  uint64_t k, v;
};

struct KvRows {
  const int* page_table;  // this sequence's row of the table; null: batched k/v
  PageDivisor page_size;
  int num_pages;

  template <class KernelParams>
  CUTE_DEVICE static KvRows of(KernelParams const& p, int batch) {
    if (p.page_table == nullptr) return KvRows{nullptr, PageDivisor{}, 0};
    return KvRows{p.page_table + batch * p.page_table_batch_stride, p.page_divisor, p.num_pages};
  }
  CUTE_DEVICE bool paged() const { return page_table != nullptr; }

  // The table's entry for key row `row` (paged; row below the sequence's clamped length), not yet
  // clamped: the clamp waits for the load, so it belongs where the page is used (page_in_range).
  CUTE_DEVICE int table_entry(int row) const { return page_table[page_size.quotient(row)]; }
  CUTE_DEVICE static int page_in_range(int entry, int num_pages) {
    return cute::min(cute::max(entry, 0), num_pages - 1);
  }
  CUTE_DEVICE int row_in_page(int row) const { return row - page_size.quotient(row) * page_size.divisor; }
  // Offset in elements of row `in_page` of page `page` from the cache's start (the head's offset
  // aside), for a tensor whose pages are page_stride and rows row_stride elements apart. The host
  // keeps page_stride and page_size · row_stride below 2^32: one 32-bit multiply and one wide one.
  CUTE_DEVICE static uint64_t offset(int page, int in_page, int64_t page_stride, int64_t row_stride) {
    return uint64_t(uint32_t(page)) * uint32_t(page_stride) + uint32_t(in_page) * uint32_t(row_stride);
  }
  // Key row `row`'s offsets, from its table entry (table_entry, read earlier).
  template <class KernelParams>
  CUTE_DEVICE KvRowOffsets offsets(int entry, int row, KernelParams const& p) const {
    const int page = page_in_range(entry, num_pages);
    const int in_page = row_in_page(row);
    return KvRowOffsets{offset(page, in_page, p.k_batch_stride, p.k_row_stride),
                        offset(page, in_page, p.v_batch_stride, p.v_row_stride)};
  }
};

}  // namespace flashcute
