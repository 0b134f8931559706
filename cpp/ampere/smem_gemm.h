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

}  // namespace flashcute::ampere
