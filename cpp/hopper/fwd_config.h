// Hopper-path tile shape per head dim: (keys per block, pipeline stages). Query rows per CTA
// are 64 per consumer warpgroup, two consumers. Chosen by measurement on H200 (see
// benchmarks/results/README.md).
#pragma once

#include "hopper/fwd_traits.h"

namespace flashcute::hopper {

template <int kHeadDim> struct FwdTileShape;
template <> struct FwdTileShape<64> { static constexpr int kBlockN = 128, kStages = 2; };
template <> struct FwdTileShape<96> { static constexpr int kBlockN = 128, kStages = 2; };
template <> struct FwdTileShape<128> { static constexpr int kBlockN = 128, kStages = 2; };
template <> struct FwdTileShape<192> { static constexpr int kBlockN = 96, kStages = 2; };
template <> struct FwdTileShape<256> { static constexpr int kBlockN = 64, kStages = 2; };

template <class Element, int kHeadDim>
using FwdTraitsFor = FwdTraits<Element, kHeadDim, FwdTileShape<kHeadDim>::kBlockN, FwdTileShape<kHeadDim>::kStages>;

}  // namespace flashcute::hopper
