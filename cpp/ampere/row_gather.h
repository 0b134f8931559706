// Tile copies whose rows lie anywhere in global memory: key rows of a paged KV cache
// (kv_rows.h) and query rows of packed heads (packed_rows.h). `src0`/`dst0` is the thread's
// partition of the tile placed with a row stride of 0, so slot m's offset holds the thread's
// columns only; `row_offset(row, m)` adds the place of the row in slot m. Rows at or past
// `valid_rows` are zero-filled on loads (kPredicated; else all rows are valid) and skipped on stores, columns at or past `valid_cols` are left alone
// (see smem_gemm.h's load_tile_cols for why they stay zero in shared memory).
#pragma once

#include <cute/tensor.hpp>

namespace flashcute::ampere {

template <bool kPredicated = true, class TiledCopy, class Src0, class Dst, class Coords, class RowOffset>
CUTE_DEVICE void gather_tile(TiledCopy const& tiled_copy, Src0 const& src0, Dst&& dst, Coords const& coords,
                             int valid_rows, int valid_cols, bool partial_cols, RowOffset&& row_offset) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    const int row = get<0>(coords(0, m, 0));
    if (!kPredicated || row < valid_rows) {
      Tensor src = make_tensor(src0(_, m, _).data() + row_offset(row, m), src0(_, m, _).layout());
      if (!partial_cols) {
        copy(tiled_copy, src, dst(_, m, _));
      } else {
#pragma unroll 1
        for (int k = 0; k < size<2>(dst); ++k)
          if (get<1>(coords(0, m, k)) < valid_cols) copy(tiled_copy, src(_, k), dst(_, m, k));
      }
    } else {
      clear(dst(_, m, _));
    }
  }
}

template <class TiledCopy, class Src, class Dst0, class Coords, class RowOffset>
CUTE_DEVICE void scatter_tile(TiledCopy const& tiled_copy, Src const& src, Dst0 const& dst0, Coords const& coords,
                              int valid_rows, int valid_cols, RowOffset&& row_offset) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    const int row = get<0>(coords(0, m, 0));
    if (row >= valid_rows) continue;
    Tensor dst = make_tensor(dst0(_, m, _).data() + row_offset(row, m), dst0(_, m, _).layout());
    CUTE_UNROLL
    for (int k = 0; k < size<2>(src); ++k)
      if (get<1>(coords(0, m, k)) < valid_cols) copy(tiled_copy, src(_, m, k), dst(_, k));
  }
}

}  // namespace flashcute::ampere
