// The shared-memory layout atom of a WGMMA operand tile: the widest swizzle (128, 64 or 32
// bytes, else none) whose row divides the tile's contiguous extent, a multiple of 16 bytes.
// Written here rather than taken from CUTLASS's collective builders, whose header brings the
// GEMM dispatch policies of every arch into each unit (cmake/FlashcuteCuteStandIns.cmake).
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>

namespace flashcute::hopper {

// The first of the atoms (widest swizzle first) whose extent along mode kMode divides kContiguous.
template <int kMode, int kContiguous, class Sw128, class Sw64, class Sw32, class Interleaved>
constexpr auto widest_swizzle_atom() {
  static_assert(kContiguous % cute::size<kMode>(Interleaved{}) == 0,
                "a WGMMA operand tile's contiguous extent is whole 16-byte units");
  if constexpr (kContiguous % cute::size<kMode>(Sw128{}) == 0) return Sw128{};
  else if constexpr (kContiguous % cute::size<kMode>(Sw64{}) == 0) return Sw64{};
  else if constexpr (kContiguous % cute::size<kMode>(Sw32{}) == 0) return Sw32{};
  else return Interleaved{};
}

// kMajor K: the tile is (rows, kContiguous), each row contiguous in memory; MN: (kContiguous,
// columns), each column contiguous.
template <cute::SM90::GMMA::Major kMajor, class Element, int kContiguous>
constexpr auto gmma_smem_atom() {
  namespace GMMA = cute::SM90::GMMA;
  if constexpr (kMajor == GMMA::Major::K)
    return widest_swizzle_atom<1, kContiguous, GMMA::Layout_K_SW128_Atom<Element>, GMMA::Layout_K_SW64_Atom<Element>,
                               GMMA::Layout_K_SW32_Atom<Element>, GMMA::Layout_K_INTER_Atom<Element>>();
  else
    return widest_swizzle_atom<0, kContiguous, GMMA::Layout_MN_SW128_Atom<Element>, GMMA::Layout_MN_SW64_Atom<Element>,
                               GMMA::Layout_MN_SW32_Atom<Element>, GMMA::Layout_MN_INTER_Atom<Element>>();
}

}  // namespace flashcute::hopper
