// A sequence's rows on the Hopper path, for variable-length batches (seq_view.h): the batch
// coordinate of a packed side's tensor map, and row-wise access to a shared-memory tile
// (rows, head dim) in the swizzled layouts that WGMMA and TMA use: zeroing the rows past a
// sequence's keys, and storing only a sequence's own rows where a TMA box would reach into the
// next sequence. Both go by 16-byte chunks, which the swizzle moves whole.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

namespace flashcute::hopper {

// The batch coordinate of a side's tensor map: a packed side (cu_seqlens given) has one
// batch of all total rows, each sequence's rows offset by its start (seq_view.h).
CUTE_HOST_DEVICE int tma_batch(const int* cu_seqlens, int batch) { return cu_seqlens != nullptr ? 0 : batch; }

// Rows [first, rows of the tile) become zeros, written by `threads` threads (this one is
// `thread`). The caller fences them for the async proxy and syncs the threads that read them.
template <class SmemTile>
CUTE_DEVICE void zero_tile_rows(SmemTile&& tile, int first, int thread, int threads) {
  using Element = typename std::remove_reference_t<SmemTile>::value_type;
  constexpr int kChunkElems = 16 / int(sizeof(Element));
  constexpr int kRows = decltype(cute::size<0>(tile))::value;
  constexpr int kChunks = decltype(cute::size<1>(tile))::value / kChunkElems;  // per row
  first = cute::max(first, 0);
  for (int i = thread + first * kChunks; i < kRows * kChunks; i += threads) {
    const int row = i / kChunks, col = i % kChunks * kChunkElems;
    *reinterpret_cast<uint4*>(&tile(row, col)) = make_uint4(0, 0, 0, 0);
  }
}

// Rows [0, rows) and columns [0, cols) (a multiple of 16 bytes) of the tile to global memory
// at dst (row r at dst + r * row_stride, 16-byte aligned), by `threads` threads.
template <class SmemTile, class Element>
CUTE_DEVICE void store_tile_rows(SmemTile const& tile, Element* dst, int64_t row_stride, int rows, int cols,
                                 int thread, int threads) {
  constexpr int kChunkElems = 16 / int(sizeof(Element));
  constexpr int kRows = decltype(cute::size<0>(tile))::value;
  constexpr int kChunks = decltype(cute::size<1>(tile))::value / kChunkElems;
  rows = cute::min(rows, kRows);
  for (int i = thread; i < rows * kChunks; i += threads) {
    const int row = i / kChunks, col = i % kChunks * kChunkElems;
    if (col < cols)
      *reinterpret_cast<uint4*>(dst + row * row_stride + col) = *reinterpret_cast<const uint4*>(&tile(row, col));
  }
}

}  // namespace flashcute::hopper
