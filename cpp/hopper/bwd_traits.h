// Tile shapes, shared-memory layouts, MMAs and TMA types of the Hopper-path backward.
//
// A CTA owns kBlockN = 128 keys of one (batch, kv head): one producer warpgroup (TMA loads)
// and two consumer warpgroups, each owning 64 of the keys, with their dK and dV in registers.
// Per query block of kBlockM rows the consumers compute, key-major (Sᵀ rather than S, so that
// Pᵀ and dSᵀ are already the register A operands of the dV and dK GEMMs):
//   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ            WGMMA, both operands in shared memory
//   dV += Pᵀ·dO, dK += dSᵀ·Q          WGMMA, A from registers, B read MN-major
//   dQ(partial) = dS·K                WGMMA, dSᵀ staged through shared memory
// and add the dQ partial into an fp32 buffer in global memory with vector reductions.
//
// dQ is split between the consumers (kDqSplit) by
//   0: head-dim columns: each multiplies the whole dS by half of K's columns;
//   1: keys: each multiplies its own dS by its own K rows into a full-width partial (no wait on
//      the other consumer, twice the reduce traffic);
//   2: query rows (128-row blocks): each multiplies half of dS's rows by all of K, as a 64-row
//      WGMMA (columns would make it 32 wide, and the dS operand is then read twice).
// Splits 0 and 2 need both consumers' dS in shared memory first.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "hopper/bwd_elements.h"
#include "hopper/gmma_extra_shapes.h"
#include "hopper/gmma_smem_atom.h"
#include "hopper/bwd_tma.h"

namespace flashcute::hopper {

using namespace cute;

template <class Element_, int kHeadDim_, int kStages_, int kDqSplit_, int kBlockM_>
struct BwdTraits {
  using Element = Element_;
  using ElementQK = typename BwdElements<Element>::ElementQK;
  using ElementV = typename BwdElements<Element>::ElementV;
  using ElementO = typename BwdElements<Element>::ElementO;
  using ElementGrad = typename BwdElements<Element>::ElementGrad;
  using ElementP = typename BwdElements<Element>::ElementP;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;        // Q (and dO) pipeline stages
  static constexpr int kDqSplit = kDqSplit_;
  static constexpr bool kDqSplitCols = kDqSplit == 0;
  static constexpr bool kDqSplitKeys = kDqSplit == 1;
  static constexpr bool kDqSplitRows = kDqSplit == 2;
  static constexpr bool kSplitsHeadDim = false;  // consumers split the keys (bwd_wide_traits.h: head dim)
  static constexpr int kConsumers = 2;
  static constexpr int kKeysPerConsumer = 64;     // one WGMMA M extent
  static constexpr int kBlockN = kKeysPerConsumer * kConsumers;
  static constexpr int kKeyTiles = kConsumers;    // 64-key TMA tiles of K and V per CTA
  static constexpr int kBlockM = kBlockM_;        // query rows per block: 64 or 128
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  // The order of a block's last three GEMMs (bwd_consumer.h): dV, then dQ and dK, or dQ, dK,
  // then dV, so that the dQ partial's reductions leave while two GEMMs still run. Measured on
  // the H200 (in-process A/B, bf16, batch·seqlen 16k): hd 64 -3 to -7 % time at 512-16k, both
  // masks; hd 128 +1 to +4 %, where dV covers the dS store, fence and barrier instead.
  static constexpr bool kDvAfterDq = kHeadDim <= 64;

  // dQ of one query block as a consumer computes it: kDqRows rows, kDqCols columns.
  static constexpr int kDqRows = kDqSplitRows ? kBlockM / kConsumers : kBlockM;
  static constexpr int kDqCols = kDqSplitCols ? kHeadDim / kConsumers : kHeadDim;
  static constexpr int kDqRegions = kDqSplitKeys ? 1 : kConsumers;  // distinct parts of the block
  static constexpr int kDqElems = kDqRows * kDqCols;  // one consumer's partial, fp32
  static constexpr int kDqRegionThreads = 128;        // a consumer warpgroup per region

  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kKeysPerConsumer>, Int<kHeadDim>>;  // one consumer's keys
  using TileSt = Shape<Int<kKeysPerConsumer>, Int<kBlockM>>;   // Sᵀ of one consumer
  using TileDq = Shape<Int<kDqRows>, Int<kDqCols>>;

  // Q and dO: (rows, hd, stage), head-dim-major and swizzled as WGMMA reads them.
  using SmemAtomQ = decltype(gmma_smem_atom<GMMA::Major::K, ElementQK, kHeadDim>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtomQ{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  // The same buffer as (hd, rows, stage): the MN-major B operand of dK += dSᵀ·Q and dV += Pᵀ·dO.
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  // K and V: (64 keys, hd, consumer), each consumer's rows one contiguous tile, so the same
  // layout serves its TMA load, its GEMMs and the dK/dV TMA store.
  using SmemAtomKV = decltype(gmma_smem_atom<GMMA::Major::K, ElementQK, kHeadDim>());
  using SmemLayoutKV = decltype(tile_to_shape(
      SmemAtomKV{}, Shape<Int<kKeysPerConsumer>, Int<kHeadDim>, Int<kConsumers>>{}));
  // K as (hd, keys, consumer): the MN-major B operand of dQ = dS·K.
  using SmemLayoutKt = decltype(composition(
      SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kKeysPerConsumer>, Int<kConsumers>>{},
                                          Step<_2, _1, _3>{})));
  // dS: (query rows, 64 keys, consumer, buffer), rows contiguous: the MN-major A operand of
  // dQ = dS·K. Two buffers, so a consumer writes the next block's dS while the other may still
  // be reading this one.
  using SmemAtomDs = decltype(gmma_smem_atom<GMMA::Major::MN, ElementP, kBlockM>());
  using SmemLayoutDs = decltype(tile_to_shape(
      SmemAtomDs{}, Shape<Int<kBlockM>, Int<kKeysPerConsumer>, Int<kConsumers>, _2>{}));
  // The same buffer as (keys, rows, consumer, buffer): how a consumer's dSᵀ registers land.
  using SmemLayoutDst = decltype(composition(
      SmemLayoutDs{}, make_ordered_layout(Shape<Int<kKeysPerConsumer>, Int<kBlockM>, Int<kConsumers>, _2>{},
                                          Step<_2, _1, _3, _4>{})));

  using TiledMmaSdP = decltype(make_tiled_mma(ss_gmma_op<
      ElementQK, ElementQK, Shape<Int<kKeysPerConsumer>, Int<kBlockM>, Int<kHeadDim>>>()));
  using TiledMmaDkv = decltype(make_tiled_mma(GMMA::rs_op_selector<
      ElementP, ElementQK, float, Shape<Int<kKeysPerConsumer>, Int<kHeadDim>, Int<kBlockM>>,
      GMMA::Major::K, GMMA::Major::MN>()));
  using TiledMmaDq = decltype(make_tiled_mma(ss_gmma_op<
      ElementP, ElementQK, Shape<Int<kDqRows>, Int<kDqCols>, Int<kKeysPerConsumer>>,
      GMMA::Major::MN, GMMA::Major::MN>()));
  static_assert(gmma_n_extent<TiledMmaSdP> == kBlockM && gmma_n_extent<TiledMmaDkv> == kHeadDim &&
                    gmma_n_extent<TiledMmaDq> == kDqCols,
                "one WGMMA spans each GEMM's N (gmma_extra_shapes.h)");
  using SmemCopyAtomDs = Copy_Atom<SM90_U32x4_STSM_N, ElementP>;       // dSᵀ into its buffer
  using SmemCopyAtomDkv = Copy_Atom<SM90_U32x4_STSM_N, ElementGrad>;  // dK, dV into K's, V's tiles

  using Tma = BwdTmaTypes<ElementQK, ElementGrad, decltype(SmemLayoutQ{}(_, _, _0{})), TileQ,
                          decltype(SmemLayoutKV{}(_, _, _0{})), TileKV>;
  using TmaQ = typename Tma::TmaQ;
  using TmaKV = typename Tma::TmaKV;
  using TmaDkv = typename Tma::TmaDkv;

  static constexpr int kQElems = cosize_v<SmemLayoutQ>;
  static constexpr int kKVElems = cosize_v<SmemLayoutKV>;
  static constexpr int kDsElems = cosize_v<SmemLayoutDs>;
  // A stage carries a Q (or dO) tile and the block's lse_log2 (or row_dot) values.
  static constexpr uint32_t kStageBytes = kBlockM * kHeadDim * sizeof(ElementQK) + kBlockM * sizeof(float);
  static constexpr uint32_t kKVBytes = 2 * kBlockN * kHeadDim * sizeof(ElementQK);

  using PipelineQ = cutlass::PipelineTmaAsync<kStages>;
  using PipelineDo = PipelineQ;

  struct SharedStorage {
    cute::array_aligned<ElementQK, kQElems, 1024> q;
    cute::array_aligned<ElementO, kQElems, 1024> dout;
    cute::array_aligned<ElementQK, kKVElems, 1024> k;
    cute::array_aligned<ElementV, kKVElems, 1024> v;
    cute::array_aligned<ElementP, kDsElems, 1024> ds;
    cute::array_aligned<float, kStages * kBlockM, 128> lse_log2;
    cute::array_aligned<float, kStages * kBlockM, 128> row_dot;
    typename PipelineQ::SharedStorage pipeline_q;
    typename PipelineQ::SharedStorage pipeline_do;
    cutlass::arch::ClusterTransactionBarrier kv_full;  // K and V landed
    int last_part;  // a split tile's part that counted itself last stores dK and dV
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "tile does not fit in shared memory");
  static_assert(!kDqSplitCols || kDqCols % 32 == 0, "a head-dim split needs 32-column parts");
  static_assert(!kDqSplitRows || kDqRows == 64, "a row split needs 128-row blocks");
  static_assert(kDqSplit >= 0 && kDqSplit <= 2, "kDqSplit: 0 columns, 1 keys, 2 rows");
  static_assert(kBlockM == 64 || kBlockM == 128, "query blocks are one or two WGMMA N extents");
};

}  // namespace flashcute::hopper
