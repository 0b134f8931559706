// Paged KV caches on the Hopper-path forward: a key block's K or V rows loaded by TMA, box by
// box, each box inside one page (kv_rows.h finds the page; paged_kernels.h says which page
// sizes and kernels qualify). The producer's one thread issues every box: the whole producer
// warp issuing one box per lane measured slower overall (benchmarks/results/README.md).
//
// The cache's tensor map is (head dim, page_size rows, K/V head, page) with boxes of 64 columns
// by box_rows = gcd(page_size, kBlockN) rows: a key block is kBlockN / box_rows boxes per
// 64 columns. Each box lands where a whole-block load would have put those rows, so consumers
// and pipeline (whose barrier expects the block's bytes, which the boxes add up to) are the
// contiguous cache's.
#pragma once

#include <cstdint>
#include <numeric>

#include <cute/tensor.hpp>

#include "hopper/tensor_map.h"
#include "kv_rows.h"
#include "launch_status.h"

namespace flashcute::hopper {

// Rows per TMA box of a paged cache with this page size for key blocks of kBlockN, or 0 where
// they would be fewer than 16 (such pages run on the Ampere path: paged_kernels.h).
template <int kBlockN>
inline int paged_box_rows(int page_size) {
  const int rows = std::gcd(page_size, kBlockN);
  return page_size > 0 && rows % 16 == 0 ? rows : 0;
}

// Element offset, before the swizzle, of row `row` (a multiple of 8) and column `col` (a
// multiple of 64) of stage `stage` in a K or V buffer: within 64 columns its rows are 128 bytes
// apart, so a box of rows lands as a whole-block load would put them.
template <class SmemLayout>
CUTE_HOST_DEVICE constexpr int paged_box_offset(int row, int col, int stage) {
  constexpr auto layout = cute::get_nonswizzle_portion(SmemLayout{});
  constexpr int kRows = decltype(cute::size<0>(layout))::value;
  constexpr int kCols = decltype(cute::size<1>(layout))::value;
  static_assert(kCols % 64 == 0 && layout(0, 1, 0) == 1 && layout(1, 0, 0) == 64 && layout(8, 0, 0) == 8 * 64 &&
                    (kCols == 64 || layout(0, 64, 0) == 64 * kRows),
                "a buffer of 64-column slabs of 128-byte rows");
  return layout(row, col, stage);
}

// The table entries of key block n's boxes: read before the producer waits for the block's
// stage, so that the reads overlap the wait (each box's page is one dependent load away from
// its TMA copy). Rows past the cache's capacity (a partial last block) take its last box,
// masked by the consumers as every row past the keys is.
template <int kBlockN>
struct PagedBlock {
  static constexpr int kMaxBoxes = kBlockN / 16;
  int n, box_rows, capacity;
  int entry[kMaxBoxes];

  CUTE_DEVICE int key(int box) const { return cute::min(n * kBlockN + box * box_rows, capacity - box_rows); }
  CUTE_DEVICE static PagedBlock read(KvRows const& rows, int n, int box_rows, int capacity) {
    PagedBlock block{n, box_rows, capacity, {}};
    CUTE_UNROLL
    for (int b = 0; b < kMaxBoxes; ++b)
      if (b * box_rows < kBlockN) block.entry[b] = rows.table_entry(block.key(b));
    return block;
  }
};

// Loads the block into stage `stage` of `smem` (kCols columns) from the paged cache behind `map`.
template <class SmemLayout, int kBlockN, int kCols, class Element>
CUTE_DEVICE void load_paged_block(cute::TmaDescriptor const& map, uint64_t* barrier, Element* smem, int stage,
                                  KvRows const& rows, PagedBlock<kBlockN> const& block, int kv_head) {
  static_assert(sizeof(Element) == 2, "64-column boxes of 128-byte rows");
  constexpr uint64_t kHint = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);
  CUTE_UNROLL
  for (int b = 0; b < PagedBlock<kBlockN>::kMaxBoxes; ++b) {
    if (b * block.box_rows < kBlockN) {
      const int page = KvRows::page_in_range(block.entry[b], rows.num_pages);
      const int in_page = rows.row_in_page(block.key(b));
      CUTE_UNROLL
      for (int col = 0; col < kCols; col += 64)
        cute::SM90_TMA_LOAD_4D::copy(&map, barrier, kHint,
                                     smem + paged_box_offset<SmemLayout>(b * block.box_rows, col, stage), col, in_page,
                                     kv_head, page);
    }
  }
}

// The tensor map of a paged K or V cache: (cols, page_size, kv_heads, num_pages) elements with
// the given strides in elements, boxes of (64, box_rows, 1, 1), swizzled as the whole-block
// loads are.
template <class Element>
Status encode_paged_kv(cute::TmaDescriptor* map, const void* ptr, int cols, int page_size, int kv_heads,
                       int num_pages, int64_t row_stride, int64_t head_stride, int64_t page_stride, int box_rows) {
  const int64_t extents[4] = {cols, page_size, kv_heads, num_pages};
  const int64_t strides[3] = {row_stride, head_stride, page_stride};
  const uint32_t box[4] = {64, uint32_t(box_rows), 1, 1};
  return encode_swizzled_map<Element>(map, ptr, extents, strides, box, "paged KV cache");
}

}  // namespace flashcute::hopper
