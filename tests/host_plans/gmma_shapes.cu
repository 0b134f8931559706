// Checks, as host code, which WGMMA instruction each GEMM of the Hopper path's default tiles
// issues without CuTe's extended shapes (the default build): one instruction spans the GEMM's
// N (the traits assert it), and hd 256's 80-key forward blocks and 40/80-wide backward GEMMs
// take gmma_extra_shapes.h's ops. Prints "ok" or the first mismatch.
#include <cstdio>
#include <type_traits>

#include "hopper/bwd_config.h"
#include "hopper/fwd_traits.h"

namespace fh = flashcute::hopper;

template <class TiledMma>
static bool shape_is(const char* what, int m, int n, int k) {
  using S = typename TiledMma::Atom::Shape_MNK;
  const int got_m = cute::size<0>(S{}), got_n = cute::size<1>(S{}), got_k = cute::size<2>(S{});
  if (got_m == m && got_n == n && got_k == k) return true;
  std::printf("%s: %dx%dx%d, expected %dx%dx%d\n", what, got_m, got_n, got_k, m, n, k);
  return false;
}

// Whether a GEMM issues gmma_extra_shapes.h's op of that N and those operand majors.
template <class TiledMma, class Element, int kN, cute::SM90::GMMA::Major kMajor>
constexpr bool own_op =
    std::is_same_v<typename TiledMma::Atom::MMA_Op, fh::gmma::GmmaSmemOp<Element, kN, kMajor, kMajor>>;

template <class Element>
static bool check() {
  using Fwd = fh::FwdTraitsFor<Element, 256>;
  using Bwd = typename fh::BwdTraitsSelect<Element, 256>::type;
  bool ok = shape_is<typename Fwd::TiledMmaQK>("forward hd 256 Q·Kᵀ", 64, 80, 16) &&
            shape_is<typename Fwd::TiledMmaPV>("forward hd 256 P·V", 64, 256, 16) &&
            shape_is<typename Bwd::TiledMmaSdP>("backward hd 256 S, dP", 64, 40, 16) &&
            shape_is<typename Bwd::TiledMmaDkv>("backward hd 256 dK, dV", 64, 80, 16);
  constexpr auto K = cute::SM90::GMMA::Major::K, MN = cute::SM90::GMMA::Major::MN;
  if (ok && !(own_op<typename Fwd::TiledMmaQK, Element, 80, K> && own_op<typename Bwd::TiledMmaSdP, Element, 40, K> &&
              own_op<typename Bwd::TiledMmaDkv, Element, 80, MN>)) {
    std::printf("hd 256: expected gmma_extra_shapes.h's ops\n");
    ok = false;
  }
  // The other head dims' traits instantiate (their static_asserts hold) with CuTe's own ops.
  (void)sizeof(fh::FwdTraitsFor<Element, 64>);
  (void)sizeof(fh::FwdTraitsFor<Element, 64, true>);
  (void)sizeof(fh::FwdTraitsFor<Element, 96>);
  (void)sizeof(fh::FwdTraitsFor<Element, 128>);
  (void)sizeof(fh::FwdTraitsFor<Element, 192>);
  (void)sizeof(fh::FwdTraitsFor<Element, 192, false, 128>);
  (void)sizeof(typename fh::BwdTraitsSelect<Element, 64>::type);
  (void)sizeof(typename fh::BwdTraitsSelect<Element, 96>::type);
  (void)sizeof(typename fh::BwdTraitsSelect<Element, 128>::type);
  return ok;
}

int main() {
#if defined(CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED)
  std::printf("built with CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED; the check is for builds without it\n");
  return 1;
#else
  const bool ok = check<cutlass::bfloat16_t>() && check<cutlass::half_t>();
  std::printf(ok ? "ok\n" : "");
  return ok ? 0 : 1;
#endif
}
