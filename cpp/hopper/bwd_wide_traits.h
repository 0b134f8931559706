// Tile shapes, shared-memory layouts, MMAs and TMA types of the Hopper-path backward for wide
// head dims (256), where one consumer cannot hold dK and dV of 64 keys in registers
// (64 keys × 256 columns × 2 = 256 fp32 registers per thread).
//
// A CTA owns kBlockN = 64 keys; the two consumer warpgroups split the head dim instead of the
// keys: consumer c holds dK and dV columns [c·hd/2, (c+1)·hd/2). Per query block of 64 rows:
//   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ      64 keys × 32 query rows each (consumer c: rows 32c..32c+31)
//   Pᵀ, dSᵀ -> shared memory     both consumers' halves make the block's 64 × 64 tiles
//   dV += Pᵀ·dO, dK += dSᵀ·Q     64 keys × hd/2, every operand from shared memory
//   dQ(partial) = dS·K           64 rows × hd/2 (the consumer's columns), added to dq_accum
// so every GEMM is done once per CTA; the price is one named barrier per block and P, dS
// written to shared memory.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "hopper/bwd_tma.h"

namespace flashcute::hopper {

using namespace cute;

template <class Element_, int kHeadDim_, int kStages_>
struct BwdWideTraits {
  using Element = Element_;
  static constexpr bool kSplitsHeadDim = true;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;  // Q (and dO) pipeline stages
  static constexpr int kConsumers = 2;
  static constexpr int kBlockN = 64;        // keys per CTA: one WGMMA M extent
  static constexpr int kBlockM = 64;        // query rows per block
  static constexpr int kKeyTiles = 1;       // 64-key TMA tiles of K and V per CTA
  static constexpr int kRowsPerConsumer = kBlockM / kConsumers;  // of Sᵀ and dPᵀ
  static constexpr int kColsPerConsumer = kHeadDim / kConsumers;  // of dK, dV and dQ
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;

  // dQ of one query block as a consumer computes it (read back by bwd_convert.h): all rows,
  // the consumer's columns.
  static constexpr bool kDqSplitCols = true;
  static constexpr bool kDqSplitRows = false;
  static constexpr int kDqRows = kBlockM;
  static constexpr int kDqCols = kColsPerConsumer;
  static constexpr int kDqRegions = kConsumers;
  static constexpr int kDqElems = kDqRows * kDqCols;

  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using TileSt = Shape<Int<kBlockN>, Int<kRowsPerConsumer>>;   // Sᵀ of one consumer
  using TileDkv = Shape<Int<kBlockN>, Int<kColsPerConsumer>>;  // dK or dV of one consumer
  using TileDq = Shape<Int<kDqRows>, Int<kDqCols>>;

  // Q and dO: (rows, hd, stage), head-dim-major and swizzled as WGMMA reads them; the (hd, rows,
  // stage) view is the MN-major B operand of dK += dSᵀ·Q and dV += Pᵀ·dO.
  using SmemAtomQ = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                             GMMA::Major::K, Element, Int<kBlockM>, Int<kHeadDim>>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtomQ{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  // K and V: (keys, hd, 1) (the last mode numbers the CTA's 64-key tiles, as the producer and
  // the launcher expect); (hd, keys, 1) is the MN-major B operand of dQ = dS·K.
  using SmemAtomKV = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                              GMMA::Major::K, Element, Int<kBlockN>, Int<kHeadDim>>());
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtomKV{}, Shape<Int<kBlockN>, Int<kHeadDim>, _1>{}));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, _1>{}, Step<_2, _1, _3>{})));
  // P and dS: (query rows, keys, buffer), rows contiguous: the MN-major A operand of
  // dQ = dS·K. The (keys, rows, buffer) view is the K-major A operand of dV and dK, and where
  // the consumers' Pᵀ/dSᵀ registers land. Two buffers: a consumer writes the next block's
  // tiles while the other may still read this block's.
  using SmemAtomPds = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                               GMMA::Major::MN, Element, Int<kBlockM>, Int<kBlockN>>());
  using SmemLayoutPds = decltype(tile_to_shape(SmemAtomPds{}, Shape<Int<kBlockM>, Int<kBlockN>, _2>{}));
  using SmemLayoutPdst = decltype(composition(
      SmemLayoutPds{}, make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, _2>{}, Step<_2, _1, _3>{})));

  using TiledMmaSdP = decltype(make_tiled_mma(GMMA::ss_op_selector<
      Element, Element, float, Shape<Int<kBlockN>, Int<kRowsPerConsumer>, Int<kHeadDim>>>()));
  using TiledMmaDkv = decltype(make_tiled_mma(GMMA::ss_op_selector<
      Element, Element, float, Shape<Int<kBlockN>, Int<kColsPerConsumer>, Int<kBlockM>>,
      GMMA::Major::K, GMMA::Major::MN>()));
  using TiledMmaDq = decltype(make_tiled_mma(GMMA::ss_op_selector<
      Element, Element, float, Shape<Int<kDqRows>, Int<kDqCols>, Int<kBlockN>>,
      GMMA::Major::MN, GMMA::Major::MN>()));
  using SmemCopyAtomStore = Copy_Atom<SM90_U32x4_STSM_N, Element>;

  using Tma = BwdTmaTypes<Element, decltype(SmemLayoutQ{}(_, _, _0{})), TileQ, decltype(SmemLayoutKV{}(_, _, _0{})), TileKV>;
  using TmaQ = typename Tma::TmaQ;
  using TmaKV = typename Tma::TmaKV;
  using TmaDkv = typename Tma::TmaDkv;

  static constexpr int kQElems = cosize_v<SmemLayoutQ>;
  static constexpr int kKVElems = cosize_v<SmemLayoutKV>;
  static constexpr int kPdsElems = cosize_v<SmemLayoutPds>;
  static constexpr uint32_t kStageBytes = kBlockM * kHeadDim * sizeof(Element) + kBlockM * sizeof(float);
  static constexpr uint32_t kKVBytes = 2 * kBlockN * kHeadDim * sizeof(Element);

  using PipelineQ = cutlass::PipelineTmaAsync<kStages>;

  struct SharedStorage {
    cute::array_aligned<Element, kQElems, 1024> q;
    cute::array_aligned<Element, kQElems, 1024> dout;
    cute::array_aligned<Element, kKVElems, 1024> k;
    cute::array_aligned<Element, kKVElems, 1024> v;
    cute::array_aligned<Element, kPdsElems, 1024> p;
    cute::array_aligned<Element, kPdsElems, 1024> ds;
    cute::array_aligned<float, kStages * kBlockM, 128> lse_log2;
    cute::array_aligned<float, kStages * kBlockM, 128> row_dot;
    typename PipelineQ::SharedStorage pipeline_q;
    typename PipelineQ::SharedStorage pipeline_do;
    cutlass::arch::ClusterTransactionBarrier kv_full;  // K and V landed
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "tile does not fit in shared memory");
  // A consumer's columns are whole swizzle atoms of the head-dim-major tiles (64 elements).
  static_assert(kColsPerConsumer % 64 == 0, "the head dim must split into 64-column parts");
};

}  // namespace flashcute::hopper
