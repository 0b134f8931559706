// Tile shapes, shared-memory layouts and copy/MMA atoms of the Ampere-path forward kernel.
//
// A CTA owns kBlockM query rows of one (batch, head) and walks the keys kBlockN at a time.
// Warps split the query rows only (16 rows each per MMA step), so every warp reads the whole
// K/V tile and no reduction between warps is needed.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/numeric_types.h>

#include "kv_rows.h"
#include "paged_kernels.h"

namespace flashcute::ampere {

template <class Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kStages_,
          bool kQInRegs_>
struct FwdTraits {
  using Element = Element_;
  // Element types per operand, as on the Hopper path (hopper/fwd_traits.h): Q and K, V, O, and
  // P as P·V's A operand. One shared-memory buffer, copy atom and MMA serve Q, K and V here, so
  // their types must agree; O (registers -> shared -> global) and P may differ.
  using ElementQK = Element;
  using ElementV = Element;
  using ElementO = Element;
  using ElementP = ElementV;
  static_assert(std::is_same_v<ElementV, ElementQK> && std::is_same_v<ElementP, ElementQK>,
                "one buffer and one MMA serve Q, K, V and P");
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kStages = kStages_;  // K/V tiles in flight (cp.async groups)
  // Q fragments stay in registers for the whole key loop; otherwise they are re-read from
  // shared memory each block (for large head dims, where registers run out).
  static constexpr bool kQInRegs = kQInRegs_;
  static_assert(kStages >= 2);
  // Rows of Q each warp owns; with 32 rows the accumulators leave no registers for reading
  // the next K slice early (measured: spills), with 16 they do.
  static constexpr int kRowsPerWarp = kBlockM / kNWarps;
  static constexpr bool kLookaheadK = kRowsPerWarp <= 16;
  static_assert(kBlockM % (16 * kNWarps) == 0 && kBlockN % 16 == 0 && kHeadDim % 32 == 0);

  using MmaAtom = std::conditional_t<std::is_same_v<ElementQK, cutlass::half_t>,
                                     cute::MMA_Atom<cute::SM80_16x8x16_F32F16F16F32_TN>,
                                     cute::MMA_Atom<cute::SM80_16x8x16_F32BF16BF16F32_TN>>;
  using TiledMma = cute::TiledMMA<MmaAtom, cute::Layout<cute::Shape<cute::Int<kNWarps>, cute::_1, cute::_1>>,
                                  cute::Tile<cute::Int<16 * kNWarps>, cute::_16, cute::_16>>;

  // Swizzled smem rows of 64 (or 32) elements: 16-byte cp.async writes and ldmatrix reads of
  // 8 rows then hit 8 different bank groups.
  static constexpr int kSmemRowElems = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleBits = kSmemRowElems == 64 ? 3 : 2;
  using SmemLayoutAtom = decltype(cute::composition(
      cute::Swizzle<kSwizzleBits, 3, 3>{},
      cute::Layout<cute::Shape<cute::_8, cute::Int<kSmemRowElems>>,
                   cute::Stride<cute::Int<kSmemRowElems>, cute::_1>>{}));
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemLayoutAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemLayoutAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
  // V read as Vᵀ (headdim, keys) for O += P·V: same bytes, transposed coordinates.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{},
      cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>{}, cute::GenRowMajor{})));
  using SmemLayoutO = SmemLayoutQ;

  static constexpr int kQElems = cute::cosize_v<SmemLayoutQ>;
  static constexpr int kKVElems = cute::cosize_v<SmemLayoutKV>;
  static constexpr int kStageElems = 2 * kKVElems;  // K tile then V tile
  // Stage 0 has its own space; stages 1.. start where Q lives when Q sits in registers
  // (Q is moved to registers before stage 1 is first written).
  static constexpr int kQRegionElems = kQElems;
  static constexpr int kSmemElems =
      kQInRegs ? kStageElems + cute::max(kQElems, (kStages - 1) * kStageElems)
               : kQElems + kStages * kStageElems;
  static constexpr int kTileBytes = kSmemElems * int(sizeof(ElementQK));
  // Kernels with paged loads keep, after the tiles, two blocks' key-row offsets (kv_rows.h).
  static constexpr int kKvRowTableBytes = has_paged_loads(kHeadDim) ? 2 * kBlockN * int(sizeof(KvRowOffsets)) : 0;
  static_assert(!has_paged_loads(kHeadDim) || kBlockN <= kNThreads, "one thread per key row fills the row table");
  static constexpr int kSmemBytes = kTileBytes + kKvRowTableBytes;

  // Global -> shared: 16-byte cp.async, threads laid out row-major over kSmemRowElems columns.
  static constexpr int kElemsPer16B = 16 / int(sizeof(ElementQK));
  static constexpr int kThreadsPerRow = kSmemRowElems / kElemsPer16B;
  static_assert(kNThreads % kThreadsPerRow == 0);
  using GmemThreadLayout = cute::Layout<cute::Shape<cute::Int<kNThreads / kThreadsPerRow>, cute::Int<kThreadsPerRow>>,
                                        cute::Stride<cute::Int<kThreadsPerRow>, cute::_1>>;
  using GmemValLayout = cute::Layout<cute::Shape<cute::_1, cute::Int<kElemsPer16B>>>;
  using GmemTiledCopyLoad = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, ElementQK>{},
      GmemThreadLayout{}, GmemValLayout{}));
  using GmemTiledCopyStore = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::UniversalCopy<cute::uint128_t>, ElementO>{}, GmemThreadLayout{},
      GmemValLayout{}));

  // Shared -> registers with ldmatrix (transposing for Vᵀ); registers -> shared for O.
  using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, ElementQK>;
  using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, ElementV>;
  using SmemCopyAtomO = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<128>, ElementO>;
};

}  // namespace flashcute::ampere
