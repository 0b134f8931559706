// Checks, as host code, that gmma_smem_atom (cpp/hopper/gmma_smem_atom.h) picks the layout atom
// that CUTLASS's collective builders pick (ss_smem_selector) for every extent of whole 16-byte
// units up to 256 elements (both refuse others), both majors, 16- and 8-bit elements. Prints
// "ok" or the first mismatch.
#include <cstdio>
#include <type_traits>
#include <utility>

#include <cutlass/gemm/collective/builders/sm90_common.inl>

#include "hopper/gmma_smem_atom.h"

namespace GMMA = cute::SM90::GMMA;

// CUTLASS's choice for an extent: the selector reads the tile's K extent for K-major operands and
// its MN extent for MN-major ones; the other extent is any multiple of 8.
template <GMMA::Major kMajor, class Element, int kExtent>
constexpr auto cutlass_atom() {
  using namespace cutlass::gemm::collective::detail;
  if constexpr (kMajor == GMMA::Major::K) return ss_smem_selector<kMajor, Element, cute::Int<64>, cute::Int<kExtent>>();
  else return ss_smem_selector<kMajor, Element, cute::Int<kExtent>, cute::Int<64>>();
}

template <GMMA::Major kMajor, class Element, int kExtent>
constexpr bool same_atom() {
  if constexpr (kExtent * cute::sizeof_bits_v<Element> % 128 != 0) {
    return true;  // not whole 16-byte units: both refuse the extent (static_assert)
  } else {
    return std::is_same_v<decltype(flashcute::hopper::gmma_smem_atom<kMajor, Element, kExtent>()),
                          decltype(cutlass_atom<kMajor, Element, kExtent>())>;
  }
}

template <GMMA::Major kMajor, class Element, int... kEighths>
static bool check(const char* what, std::integer_sequence<int, kEighths...>) {
  const bool same[] = {same_atom<kMajor, Element, 8 * (kEighths + 1)>()...};
  for (int i = 0; i < int(sizeof...(kEighths)); ++i) {
    if (!same[i]) {
      std::printf("%s, extent %d: a different atom than ss_smem_selector's\n", what, 8 * (i + 1));
      return false;
    }
  }
  return true;
}

int main() {
  using Extents = std::make_integer_sequence<int, 32>;  // 8, 16, ..., 256
  const bool ok = check<GMMA::Major::K, cutlass::bfloat16_t>("K-major bf16", Extents{}) &&
                  check<GMMA::Major::MN, cutlass::bfloat16_t>("MN-major bf16", Extents{}) &&
                  check<GMMA::Major::K, cutlass::half_t>("K-major fp16", Extents{}) &&
                  check<GMMA::Major::MN, cutlass::half_t>("MN-major fp16", Extents{}) &&
                  check<GMMA::Major::K, cutlass::float_e4m3_t>("K-major e4m3", Extents{}) &&
                  check<GMMA::Major::MN, cutlass::float_e4m3_t>("MN-major e4m3", Extents{});
  std::printf(ok ? "ok\n" : "");
  return ok ? 0 : 1;
}
