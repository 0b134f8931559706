// The shared-memory layout atom of a WGMMA operand tile: the widest swizzle (128, 64 or 32
// bytes, else none) whose row divides the tile's contiguous extent, a multiple of 16 bytes. Written here rather than
// taken from CUTLASS's collective builders, whose header brings the GEMM dispatch policies of
// every arch into each unit (cmake/FlashcuteCuteStandIns.cmake).
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>

namespace flashcute::hopper {

// kMajor K: the tile is (kRows, kContiguous) with kContiguous elements per row in memory;
// MN: (kContiguous, kRows) with the first mode contiguous.
template <cute::SM90::GMMA::Major kMajor, class Element, int kContiguous>
constexpr auto gmma_smem_atom() {
  namespace GMMA = cute::SM90::GMMA;
  static_assert(kContiguous % 8 == 0, "a WGMMA operand tile's contiguous extent is a multiple of 8");
  if constexpr (kMajor == GMMA::Major::K) {
    constexpr int kSw128 = cute::size<1>(GMMA::Layout_K_SW128_Atom<Element>{});
    constexpr int kSw64 = cute::size<1>(GMMA::Layout_K_SW64_Atom<Element>{});
    constexpr int kSw32 = cute::size<1>(GMMA::Layout_K_SW32_Atom<Element>{});
    constexpr int kInter = cute::size<1>(GMMA::Layout_K_INTER_Atom<Element>{});
    static_assert(kContiguous % kInter == 0, "a K-major tile's rows are whole 16-byte units");
    if constexpr (kContiguous % kSw128 == 0) return GMMA::Layout_K_SW128_Atom<Element>{};
    else if constexpr (kContiguous % kSw64 == 0) return GMMA::Layout_K_SW64_Atom<Element>{};
    else if constexpr (kContiguous % kSw32 == 0) return GMMA::Layout_K_SW32_Atom<Element>{};
    else return GMMA::Layout_K_INTER_Atom<Element>{};
  } else {
    constexpr int kSw128 = cute::size<0>(GMMA::Layout_MN_SW128_Atom<Element>{});
    constexpr int kSw64 = cute::size<0>(GMMA::Layout_MN_SW64_Atom<Element>{});
    constexpr int kSw32 = cute::size<0>(GMMA::Layout_MN_SW32_Atom<Element>{});
    constexpr int kInter = cute::size<0>(GMMA::Layout_MN_INTER_Atom<Element>{});
    static_assert(kContiguous % kInter == 0, "an MN-major tile's columns are whole 16-byte units");
    if constexpr (kContiguous % kSw128 == 0) return GMMA::Layout_MN_SW128_Atom<Element>{};
    else if constexpr (kContiguous % kSw64 == 0) return GMMA::Layout_MN_SW64_Atom<Element>{};
    else if constexpr (kContiguous % kSw32 == 0) return GMMA::Layout_MN_SW32_Atom<Element>{};
    else return GMMA::Layout_MN_INTER_Atom<Element>{};
  }
}

}  // namespace flashcute::hopper
