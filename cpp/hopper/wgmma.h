// Issue one warpgroup GEMM (all k-slices of a tile) as a single WGMMA commit group.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

namespace flashcute::hopper {

// C (+)= A·B over the K mode of the fragments. Returns once the WGMMAs are issued; the
// caller waits with cute::warpgroup_wait<N>(). A may be shared-memory descriptors or
// registers (then fenced, so the compiler keeps them live until the wait).
template <bool kZeroInit, class TiledMma, class FragA, class FragB, class FragC>
CUTE_DEVICE void wgmma_issue(TiledMma& mma, FragA&& a, FragB const& b, FragC& c) {
  using namespace cute;
  constexpr bool kARegisters = !is_same_v<typename std::decay_t<FragA>::value_type, GMMA::DescriptorIterator::value_type>;
  if constexpr (kARegisters) warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kARegisters) warpgroup_fence_operand(a);
}

}  // namespace flashcute::hopper
