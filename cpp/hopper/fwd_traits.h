// Tile shapes, shared-memory layouts, MMAs and TMA types of the Hopper-path forward.
//
// A CTA has one producer warpgroup (TMA loads) and kConsumers consumer warpgroups. Each
// consumer owns 64 query rows of the CTA's kConsumers * 64-row Q tile and runs its own WGMMAs:
// S = Q·Kᵀ with both operands in shared memory, O += P·V with P in registers.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "hopper/fwd_config.h"
#include "hopper/fwd_fp8_scales.h"
#include "hopper/gmma_extra_shapes.h"
#include "hopper/gmma_smem_atom.h"
#include "hopper/tile_scheduler.h"

namespace flashcute::hopper {

using namespace cute;

// Element types per operand: Q and K (ElementQK), V, O (and its staging), and P, the
// probabilities as the A operand of P·V. A 16-bit Element is every operand's type; e4m3
// (FP8) reads Q, K and V as e4m3, multiplies P as e4m3 too and writes a 16-bit O (ElementO_).
// kHeadDimV: the head dim of V and O (default kHeadDim); Q·Kᵀ runs over kHeadDim, P·V and O
// over kHeadDimV.
template <class Element_, int kHeadDim_, int kBlockN_, int kStages_, int kConsumers_ = 2, int kHeadDimV_ = kHeadDim_,
          class ElementO_ = Element_, bool kClaimVariant_ = false>
struct FwdTraits {
  using Element = Element_;
  using ElementQK = Element;
  using ElementV = Element;
  using ElementO = ElementO_;
  using ElementP = ElementV;  // the A operand of P·V takes V's type
  // 8-bit WGMMA reads both operands K-major only: V (keys × hdv, hdv contiguous) is copied
  // transposed by the producer warpgroup's other warps (fwd_v_transpose.h).
  static constexpr bool kTransposesV = sizeof(ElementV) == 1;
  static constexpr int kTransposeWarps = kTransposesV ? 3 : 0;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockN = kBlockN_;    // keys per block
  static constexpr int kStages = kStages_;    // K and V pipelines, each
  static constexpr int kConsumers = kConsumers_;
  // Variable-length and windowed calls claim their tiles (tile_scheduler.h), 16-bit only. The three-consumer
  // tiles (hd 64 to 128) compile the claims in; the two-consumer ones (hd 192 and 256, no
  // registers to spare) run them in a variant of their own (kClaimVariant_): compiled into the
  // one kernel, they made its short dense calls up to 8 % slower on an H100
  // (benchmarks/results/README.md).
  static constexpr bool kClaimsTiles = !kTransposesV && (kConsumers == 3 || kClaimVariant_);
  // Whether the tile walks of the producer thread and the consumers hold their unit across a
  // tile's key blocks (TileWalk, tile_scheduler.h): not where the two-consumer tiles
  // leave no registers to spare (held, the tile's coordinates spilled at hd 256).
  static constexpr bool kWalksHoldUnit = kConsumers == 3;
  // 8-bit calls never split a tile's key blocks (fwd_launch.h): their walks compile no pieces.
  static constexpr bool kSplitsTiles = !kTransposesV;
  static constexpr int kRowsPerConsumer = 64; // one WGMMA M extent
  static constexpr int kBlockM = kRowsPerConsumer * kConsumers;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kTransposeUnits = kBlockN / 16 * (kHeadDimV / 32);  // 16 keys x 32 columns each
  static constexpr int kTransposeUnitsPerWarp = kTransposesV ? (kTransposeUnits + kTransposeWarps - 1) / kTransposeWarps : 0;
  // A consumer thread's accumulators: S and O in fp32, P in 8 bits (8-bit tiles).
  static constexpr int kAccumulatorRegs = (kBlockN + kHeadDimV) / 2 + kBlockN / 8;
  // The consumers' registers beside a producer warpgroup that keeps `producer`.
  static constexpr int consumer_regs(int producer) {
    return cute::min(240, ((65536 / kThreads) / 8 * 8 * kThreads / 128 - producer) / kConsumers / 8 * 8);
  }
  // 8-bit tiles whose accumulators leave the consumers fewer than 32 other registers beside a
  // transposing warpgroup of 40 (of the default tiles, hd 256 on 128 keys): the producer
  // warpgroup keeps 24, and both keep little live across key blocks: pipeline
  // positions as counts (pipeline_count.h), the tile's descales in shared memory, its
  // coordinates decoded again, the transposing lanes' constants read per block.
  static constexpr bool kLeanState = kTransposesV && consumer_regs(40) - kAccumulatorRegs < 32;
  // Whether the consumers take turns issuing their GEMMs (MmaTurns, named_barriers.h). The
  // 8-bit tile of two consumers with registers to spare (hd 128) does not: its consumers issue
  // as soon as their operands are in, and search a row's max over eight running maxima
  // (OnlineSoftmax::update_near_kept_max); at hd 64 (three consumers) and hd 256 (kLeanState:
  // it spilled) both measured slower (benchmarks/results/h200-fp8-free-issue.txt).
  static constexpr bool kTakesTurns = !(kTransposesV && kConsumers == 2 && !kLeanState);
  // setmaxnreg: what the TMA warpgroup keeps (more where its warps also transpose V).
  static constexpr int kProducerRegs = !kTransposesV || kLeanState ? 24 : 40;
  // The rest of the CTA's allocation, shared by the consumers (a multiple of 8, at most 240).
  static constexpr int kConsumerRegs = consumer_regs(kProducerRegs);
  // setmaxnreg only moves registers within the CTA's launch allocation (65536 / kThreads per
  // thread, rounded down to 8); asking for more than it holds waits forever.
  static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= (65536 / kThreads) / 8 * 8 * kThreads,
                "producer + consumer registers exceed the CTA's allocation");

  using TileQ = Shape<Int<kRowsPerConsumer>, Int<kHeadDim>>;   // one consumer's Q rows
  using TileO = Shape<Int<kRowsPerConsumer>, Int<kHeadDimV>>;  // one consumer's O rows
  using TileK = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using TileV = Shape<Int<kBlockN>, Int<kHeadDimV>>;
  using TileS = Shape<Int<kRowsPerConsumer>, Int<kBlockN>>;

  // Head-dim-major tiles, swizzled as WGMMA reads them (128-byte swizzle where hd allows).
  using SmemAtomQK = decltype(gmma_smem_atom<GMMA::Major::K, ElementQK, kHeadDim>());
  using SmemAtomV = decltype(gmma_smem_atom<GMMA::Major::K, ElementV, kHeadDimV>());
  using SmemAtomO = decltype(gmma_smem_atom<GMMA::Major::K, ElementO, kHeadDimV>());
  // Q: (64 rows, hd, consumer): each consumer's rows are one contiguous block, so the O tile
  // a consumer writes in its epilogue never overlaps rows another consumer still reads.
  using SmemLayoutQ = decltype(tile_to_shape(
      SmemAtomQK{}, Shape<Int<kRowsPerConsumer>, Int<kHeadDim>, Int<kConsumers>>{}));
  // O's staging for its TMA store, laid out as Q's buffer is (the same layout where the types
  // and head dims agree).
  using SmemLayoutO = decltype(tile_to_shape(
      SmemAtomO{}, Shape<Int<kRowsPerConsumer>, Int<kHeadDimV>, Int<kConsumers>>{}));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtomQK{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{}));
  // V as P·V's B operand (hdv, keys, stage). 16-bit: V's buffer seen MN-major, no transpose
  // in memory. 8-bit: a buffer of its own, K-major (keys contiguous), written by the transpose.
  using SmemLayoutVtView = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{},
                                         Step<_2, _1, _3>{})));
  using SmemAtomVt = decltype(gmma_smem_atom<GMMA::Major::K, ElementV, kBlockN>());
  using SmemLayoutVtBuffer = decltype(tile_to_shape(SmemAtomVt{}, Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{}));
  using SmemLayoutVt = std::conditional_t<kTransposesV, SmemLayoutVtBuffer, SmemLayoutVtView>;
  static constexpr int kVtElems = kTransposesV ? int(cosize_v<SmemLayoutVtBuffer>) : 8;

  using TiledMmaQK = decltype(make_tiled_mma(
      ss_gmma_op<ElementQK, ElementQK, Shape<Int<kRowsPerConsumer>, Int<kBlockN>, Int<kHeadDim>>>()));
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<ElementP, ElementV, float, Shape<Int<kRowsPerConsumer>, Int<kHeadDimV>, Int<kBlockN>>,
                           GMMA::Major::K, kTransposesV ? GMMA::Major::K : GMMA::Major::MN>()));
  static_assert(gmma_n_extent<TiledMmaQK> == kBlockN && gmma_n_extent<TiledMmaPV> == kHeadDimV,
                "one WGMMA spans each GEMM's N (gmma_extra_shapes.h)");
  using SmemCopyAtomO = Copy_Atom<SM90_U32x4_STSM_N, ElementO>;

  // Global tensors as TMA sees them: (seqlen, hd, heads, batch), unit stride along hd.
  using GmemLayout = Layout<Shape<int32_t, int32_t, int32_t, int32_t>, Stride<int64_t, _1, int64_t, int64_t>>;
  using GmemQK = decltype(make_tensor(make_gmem_ptr(static_cast<ElementQK const*>(nullptr)), GmemLayout{}));
  using GmemV = decltype(make_tensor(make_gmem_ptr(static_cast<ElementV const*>(nullptr)), GmemLayout{}));
  using GmemOut = decltype(make_tensor(make_gmem_ptr(static_cast<ElementO*>(nullptr)), GmemLayout{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemQK{}, SmemLayoutQ{}(_, _, _0{}), TileQ{}, _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemQK{}, SmemLayoutK{}(_, _, _0{}), TileK{}, _1{}));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemV{}, SmemLayoutV{}(_, _, _0{}), TileV{}, _1{}));
  using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemOut{}, SmemLayoutO{}(_, _, _0{}), TileO{}, _1{}));

  static constexpr int kQElems = cosize_v<SmemLayoutQ>;
  static constexpr int kOElems = cosize_v<SmemLayoutO>;
  static constexpr int kKElems = cosize_v<SmemLayoutK>;
  static constexpr int kVElems = cosize_v<SmemLayoutV>;
  static constexpr uint32_t kQBytes = kQElems * sizeof(ElementQK);
  static constexpr int kOBufferBytes = kOElems * int(sizeof(ElementO));
  static constexpr uint32_t kKBlockBytes = kBlockN * kHeadDim * sizeof(ElementQK);
  static constexpr uint32_t kVBlockBytes = kBlockN * kHeadDimV * sizeof(ElementV);
  // Where O is staged for its TMA store: its own buffer when that fits; else the start of V's
  // buffer (the next tile's V loads wait for the O store, but its Q and first K blocks do not);
  // else Q's buffer (the next tile's Q load waits for the O store).
  static constexpr int kSmemLimit = 227 * 1024;
  static constexpr int kVtBytes = kTransposesV ? kVtElems * int(sizeof(ElementV)) : 0;
  static constexpr bool kOOwnBuffer = int(kQBytes) + kOBufferBytes + kKElems * int(sizeof(ElementQK)) +
                                          kVElems * int(sizeof(ElementV)) + kVtBytes + 1024 <= kSmemLimit;
  static constexpr bool kOAliasesV = !kOOwnBuffer && kVElems * int(sizeof(ElementV)) >= kOBufferBytes;
  static constexpr bool kOAliasesQ = !kOOwnBuffer && !kOAliasesV;
  // In Q's buffer each consumer's O must sit on its own Q rows, which other consumers never read.
  static_assert(!kOAliasesQ || (kHeadDimV == kHeadDim && sizeof(ElementO) == sizeof(ElementQK)),
                "O staged in Q's buffer needs Q's layout");
  // 8-bit tiles may stage O in V's buffer too: a consumer stores O only after taking every
  // transposed stage of its tile, so the transposing warps have read the tile's V by then, and
  // the next tile's V waits for the O stores.
  static_assert(!kTransposesV || !kOAliasesQ, "an FP8 tile cannot stage O in Q's buffer");

  // Arrivals that free Q's buffer: every consumer thread after its last Q·Kᵀ, or, when O
  // reuses the buffer, one thread per consumer after its O store has read it.
  static constexpr int kQEmptyArrivals = kOAliasesQ ? kConsumers : 128 * kConsumers;

  using PipelineKV = cutlass::PipelineTmaAsync<kStages>;
  // 8-bit: the transposed V's stages, written by the transposing warps, read by the consumers.
  using PipelineVt = cutlass::PipelineAsync<kStages>;

  struct SharedStorage {
    cute::array_aligned<ElementQK, kQElems, 1024> q;
    cute::array_aligned<ElementQK, kKElems, 1024> k;
    cute::array_aligned<ElementV, kVElems, 1024> v;
    cute::array_aligned<ElementV, kVtElems, 1024> vt;
    cute::array_aligned<ElementO, kOOwnBuffer ? kOElems : 8, 1024> o;
    typename PipelineKV::SharedStorage pipeline_k;
    typename PipelineKV::SharedStorage pipeline_v;
    typename PipelineVt::SharedStorage pipeline_vt;
    cutlass::arch::ClusterTransactionBarrier q_full;  // Q of the current tile landed
    cutlass::arch::ClusterBarrier q_empty;            // consumers are done with Q's buffer
    cutlass::arch::ClusterBarrier o_empty;            // O in V's buffer: the O stores have read it
    TileClaims claims;                                // the claimed tile order's ring (tile_scheduler.h)
    Fp8TileScales fp8_scales[kLeanState ? 4 * kConsumers : 1];  // kLeanState: each consumer warp's tile descales
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= kSmemLimit, "tile does not fit in shared memory");
};

// A (head dim, V head dim) pair takes the tile of its Q·Kᵀ head dim (fwd_config.h); e4m3 its
// FP8 tile, with a bf16 O.
template <class Element> constexpr bool kIsFp8 = sizeof(Element) == 1;
template <class Element, int kHeadDim, bool kSecondTile, class Shape =
          std::conditional_t<kIsFp8<Element>, FwdFp8TileShape<kHeadDim>,
                             std::conditional_t<kSecondTile, FwdSecondTileShape<kHeadDim>, FwdTileShape<kHeadDim>>>>
struct FwdTileOf : Shape {};
template <class Element, int kHeadDim, bool kSecondTile = false, int kHeadDimV = kHeadDim, bool kClaimVariant = false,
          class Shape = FwdTileOf<Element, kHeadDim, kSecondTile>>
using FwdTraitsFor = FwdTraits<Element, kHeadDim, Shape::kBlockN_, Shape::kStages_, Shape::kConsumers_, kHeadDimV,
                               std::conditional_t<kIsFp8<Element>, cutlass::bfloat16_t, Element>, kClaimVariant>;
// Whether a head dim's 16-bit tile runs claimed tiles in a kernel variant of its own.
template <int kHeadDim> constexpr bool kFwdClaimVariant = FwdTileShape<kHeadDim>::kConsumers_ != 3;

}  // namespace flashcute::hopper
