// Tile shapes, shared-memory layouts and copy/MMA atoms of the Ampere-path backward kernel.
//
// A CTA owns kBlockN keys of one (batch, kv head) and walks the query rows kBlockM at a time,
// over every query head of the GQA group. Per query block it runs four GEMMs, each pair with
// its own warp arrangement (so register tiles stay small for every head dim), and a fifth
// unless the call is deterministic:
//   S  = Q·Kᵀ,  dP = dO·Vᵀ   (kBlockM × kBlockN)   warps kWarpsMSdP × rest
//   dV += Pᵀ·dO, dK += dSᵀ·Q  (kBlockN × headdim)   warps kWarpsNdKV × rest
//   dQ part = dS·K           (kBlockM × headdim)   warps kWarpsMdQ × rest
// P and dS go through shared memory, which gives the transposed operands of dV and dK.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/numeric_types.h>

namespace flashcute::ampere {

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_,
          int kWarpsMSdP_, int kWarpsNdKV_, int kQStages_>
struct BwdTraits {
  using Element = Element_;
  // Element types per operand, as on the Hopper path (hopper/bwd_elements.h): Q and K, V, O
  // and dO, the dQ/dK/dV outputs, P and dS. One shared-memory buffer and one MMA serve them
  // all here, so their types must agree; each use names its operand.
  using ElementQK = Element;
  using ElementV = Element;
  using ElementO = Element;
  using ElementGrad = Element;
  using ElementP = Element;
  static_assert(std::is_same_v<ElementV, ElementQK> && std::is_same_v<ElementO, ElementQK> &&
                    std::is_same_v<ElementP, ElementQK> && std::is_same_v<ElementGrad, ElementQK>,
                "one buffer and one MMA serve every operand");
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  // Q/dO buffers: 2 lets the next query block load while this one computes.
  static constexpr int kQStages = kQStages_;
  static_assert(kQStages == 1 || kQStages == 2);

  using MmaAtom = std::conditional_t<std::is_same_v<ElementQK, cutlass::half_t>,
                                     cute::MMA_Atom<cute::SM80_16x8x16_F32F16F16F32_TN>,
                                     cute::MMA_Atom<cute::SM80_16x8x16_F32BF16BF16F32_TN>>;
  // kWarpsM warps along the first mode, the rest along the second; 16×16 per warp and step.
  template <int kWarpsM>
  using TiledMmaWith = cute::TiledMMA<
      MmaAtom, cute::Layout<cute::Shape<cute::Int<kWarpsM>, cute::Int<kNWarps / kWarpsM>, cute::_1>>,
      cute::Tile<cute::Int<16 * kWarpsM>, cute::Int<16 * (kNWarps / kWarpsM)>, cute::_16>>;
  using TiledMmaSdP = TiledMmaWith<kWarpsMSdP_>;
  using TiledMmadKV = TiledMmaWith<kWarpsNdKV_>;
  static_assert(kBlockM % (16 * kWarpsMSdP_) == 0 && kBlockN % (16 * (kNWarps / kWarpsMSdP_)) == 0);
  static_assert(kBlockN % (16 * kWarpsNdKV_) == 0 && kHeadDim % (16 * (kNWarps / kWarpsNdKV_)) == 0);

  // dQ's warps: of the splits that tile kBlockM × headdim, the one whose warp tile is closest
  // to square (fewest shared-memory reads per MMA), the taller one on a tie.
  static constexpr int dq_warps_m() {
    int best = 0, best_skew = 0;
    for (int warps_m = kNWarps; warps_m >= 1; warps_m /= 2) {
      const int rows = kBlockM / warps_m, cols = kHeadDim / (kNWarps / warps_m);
      if (kBlockM % (16 * warps_m) != 0 || kHeadDim % (16 * (kNWarps / warps_m)) != 0) continue;
      const int skew = rows > cols ? rows / cols : cols / rows;
      if (best == 0 || skew < best_skew) best = warps_m, best_skew = skew;
    }
    return best;
  }
  static constexpr int kWarpsMdQ = dq_warps_m();
  static_assert(kWarpsMdQ > 0, "no warp split tiles dQ");
  using TiledMmadQ = TiledMmaWith<kWarpsMdQ>;

  // Swizzled rows of 64 (or 32) elements, as in the forward: conflict-free 16-byte cp.async
  // writes and ldmatrix reads, plain or transposed.
  template <int kRowElems>
  using SwizzleAtom = decltype(cute::composition(
      cute::Swizzle<kRowElems == 64 ? 3 : 2, 3, 3>{},
      cute::Layout<cute::Shape<cute::_8, cute::Int<kRowElems>>, cute::Stride<cute::Int<kRowElems>, cute::_1>>{}));
  static constexpr int kSmemRowElems = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kPRowElems = kBlockN % 64 == 0 ? 64 : 32;

  template <class Layout, int kRows, int kCols>
  using Transposed = decltype(cute::composition(
      Layout{}, cute::make_layout(cute::Shape<cute::Int<kCols>, cute::Int<kRows>>{}, cute::GenRowMajor{})));

  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SwizzleAtom<kSmemRowElems>{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SwizzleAtom<kSmemRowElems>{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
  using SmemLayoutP = decltype(cute::tile_to_shape(
      SwizzleAtom<kPRowElems>{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>>{}));
  using SmemLayoutQt = Transposed<SmemLayoutQ, kBlockM, kHeadDim>;   // (headdim, rows): Qᵀ, dOᵀ
  using SmemLayoutPt = Transposed<SmemLayoutP, kBlockM, kBlockN>;    // (keys, rows): Pᵀ, dSᵀ
  using SmemLayoutKt = Transposed<SmemLayoutKV, kBlockN, kHeadDim>;  // (headdim, keys): Kᵀ

  // Shared memory: [K][V][Q stages][dO stages][P][dS]; dK and dV are staged in K/V's place.
  static constexpr int kQElems = cute::cosize_v<SmemLayoutQ>;
  static constexpr int kKVElems = cute::cosize_v<SmemLayoutKV>;
  static constexpr int kPElems = cute::cosize_v<SmemLayoutP>;
  static constexpr int kOffsetV = kKVElems;
  static constexpr int kOffsetQ = 2 * kKVElems;
  static constexpr int kOffsetDO = kOffsetQ + kQStages * kQElems;
  static constexpr int kOffsetP = kOffsetDO + kQStages * kQElems;
  static constexpr int kOffsetDS = kOffsetP + kPElems;
  static constexpr int kSmemBytes = (kOffsetDS + kPElems) * int(sizeof(ElementQK));

  // Global -> shared: 16-byte cp.async, threads row-major over kSmemRowElems columns.
  static constexpr int kElemsPer16B = 16 / int(sizeof(ElementQK));
  static constexpr int kThreadsPerRow = kSmemRowElems / kElemsPer16B;
  static constexpr int kRowsPerCopy = kNThreads / kThreadsPerRow;
  static_assert(kBlockM % kRowsPerCopy == 0 && kBlockN % kRowsPerCopy == 0);
  using GmemThreadLayout = cute::Layout<cute::Shape<cute::Int<kRowsPerCopy>, cute::Int<kThreadsPerRow>>,
                                        cute::Stride<cute::Int<kThreadsPerRow>, cute::_1>>;
  using GmemValLayout = cute::Layout<cute::Shape<cute::_1, cute::Int<kElemsPer16B>>>;
  using GmemTiledCopyLoad = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, ElementQK>{},
      GmemThreadLayout{}, GmemValLayout{}));
  using GmemTiledCopyStore = decltype(cute::make_tiled_copy(  // dQ, dK, dV
      cute::Copy_Atom<cute::UniversalCopy<cute::uint128_t>, ElementGrad>{}, GmemThreadLayout{},
      GmemValLayout{}));

  using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, ElementQK>;
  using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, ElementQK>;
  // P and dS, and dK/dV before their store (one type: see the assertion above)
  using SmemCopyAtomStore = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<128>, ElementP>;

  // dq_accum's order, for bwd_dq_convert.h: a query block's partial is one region, in the
  // register order of TiledMmaDq over all threads (thread t's values i..i+3 at i·kNThreads + 4t).
  using TiledMmaDq = TiledMmadQ;
  using TileDq = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>;
  static constexpr int kDqRegions = 1;
  static constexpr int kDqRegionThreads = kNThreads;
  static constexpr int kDqRows = kBlockM, kDqCols = kHeadDim, kDqElems = kBlockM * kHeadDim;
  static constexpr bool kDqSplitRows = false, kDqSplitCols = false;
};

}  // namespace flashcute::ampere
