// Building blocks of the Ampere-path kernels: tiles copied global -> shared with cp.async,
// and mma.sync GEMMs whose operands are read from shared memory one k-slice at a time.
#pragma once

#include <cute/tensor.hpp>

namespace flashcute::ampere {

// acc += A·B over the K mode, operands read from shared memory one k-slice at a time. With
// kLookahead the next slice is read before the current one is multiplied (hides ldmatrix
// latency at the cost of a second slice of registers). A is not read when it already sits in
// registers.
template <bool kAInRegs, bool kLookahead, class Acc, class FragA, class FragB, class SmemA,
          class ViewA, class SmemB, class ViewB, class TiledMma, class CopyA, class CopyB>
CUTE_DEVICE void gemm_from_smem(Acc& acc, FragA const& frag_a, FragB const& frag_b,
                                SmemA const& smem_a, ViewA&& view_a, SmemB const& smem_b,
                                ViewB&& view_b, TiledMma const& mma, CopyA const& copy_a,
                                CopyB const& copy_b) {
  using namespace cute;
  constexpr int kSlices = decltype(size<2>(frag_a))::value;
  auto load_slice = [&](int k) {
    if constexpr (!kAInRegs) copy(copy_a, smem_a(_, _, k), view_a(_, _, k));
    copy(copy_b, smem_b(_, _, k), view_b(_, _, k));
  };
  if constexpr (kLookahead) load_slice(0);
  CUTE_UNROLL
  for (int k = 0; k < kSlices; ++k) {
    if constexpr (kLookahead) {
      if (k + 1 < kSlices) load_slice(k + 1);
    } else {
      load_slice(k);
    }
    gemm(mma, frag_a(_, _, k), frag_b(_, _, k), acc);
  }
}

// Global -> shared copy of a (rows, headdim) tile whose rows past `valid_rows` are zero-filled
// (zeros, not garbage: padded V rows meet P = 0, and 0 * NaN would poison the output).
template <bool kPredicated, class TiledCopy, class Src, class Dst, class Coords>
CUTE_DEVICE void load_tile(TiledCopy const& tiled_copy, Src const& src, Dst&& dst,
                           Coords const& coords, int valid_rows) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    if (!kPredicated || get<0>(coords(0, m, 0)) < valid_rows) {
      copy(tiled_copy, src(_, m, _), dst(_, m, _));
    } else {
      clear(dst(_, m, _));
    }
  }
}

// A call whose head dim is below the kernel's (rounded up to it) reads only its own columns:
// its tiles' 16-byte chunks from column `valid_cols` on (a multiple of 8) are zeroed once per
// shared-memory buffer (clear_tile_cols, before the buffer's first load; nothing else writes
// them), so that they add nothing to Q·Kᵀ or dO·Vᵀ, and load_tile_cols leaves them alone
// (clearing them on every load spilled at the register cap in the key loops). Rows past
// `valid_rows` are zero-filled whole, as in load_tile.
template <bool kPredicateRows, class TiledCopy, class Src, class Dst, class Coords>
CUTE_DEVICE void load_tile_cols(TiledCopy const& tiled_copy, Src const& src, Dst&& dst, Coords const& coords,
                                int valid_rows, int valid_cols) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    if (!kPredicateRows || get<0>(coords(0, m, 0)) < valid_rows) {
#pragma unroll 1  // unrolled, the column tests cost registers in the key loops (spills at hd 256)
      for (int k = 0; k < size<2>(dst); ++k) {
        if (get<1>(coords(0, m, k)) < valid_cols) copy(tiled_copy, src(_, m, k), dst(_, m, k));
      }
    } else {
      clear(dst(_, m, _));
    }
  }
}

// The same with every chunk's predicate on one zero-filling cp.async (rows past `valid_rows` and
// columns past `valid_cols` read nothing and land as zeros): straight-line code, for loops at
// the register cap.
template <class TiledCopy, class Src, class Dst, class Coords>
CUTE_DEVICE void load_tile_zfill(TiledCopy const& tiled_copy, Src const& src, Dst&& dst, Coords const& coords,
                                 int valid_rows, int valid_cols) {
  using namespace cute;
  using Element = typename std::remove_reference_t<Dst>::value_type;
  using Zfill = cute::TiledCopy<Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>, Element>,
                                typename TiledCopy::TiledLayout_TV, typename TiledCopy::Tiler_MN>;
  Zfill zfill;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    CUTE_UNROLL
    for (int k = 0; k < size<2>(dst); ++k) {
      const bool keep = get<0>(coords(0, m, k)) < valid_rows && get<1>(coords(0, m, k)) < valid_cols;
      copy(zfill.with(keep), src(_, m, k), dst(_, m, k));
    }
  }
}

template <class Dst, class Coords>
CUTE_DEVICE void clear_tile_cols(Dst&& dst, Coords const& coords, int valid_cols) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    CUTE_UNROLL
    for (int k = 0; k < size<2>(dst); ++k) {
      if (get<1>(coords(0, m, k)) >= valid_cols) clear(dst(_, m, k));
    }
  }
}

// Registers -> global memory of a tile's 16-byte row chunks (a store partition), for a call
// whose head dim is below the kernel's: neither rows from `valid_rows` on nor chunks from
// column `valid_cols` on are written.
template <class TiledCopy, class Src, class Dst, class Coords>
CUTE_DEVICE void store_tile_cols(TiledCopy const& tiled_copy, Src const& src, Dst&& dst, Coords const& coords,
                                 int valid_rows, int valid_cols) {
  using namespace cute;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    if (get<0>(coords(0, m, 0)) < valid_rows) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(dst); ++k) {
        if (get<1>(coords(0, m, k)) < valid_cols) copy(tiled_copy, src(_, m, k), dst(_, m, k));
      }
    }
  }
}

}  // namespace flashcute::ampere
