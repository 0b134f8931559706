// Tile shapes, shared-memory layouts, MMAs and TMA types of the Hopper-path backward that
// splits the head dim (hd 256; hd 128 as a tuning choice). At hd 256 one consumer cannot hold
// dK and dV of 64 keys in registers (64 keys × 256 columns × 2 = 256 fp32 registers per thread).
//
// A CTA owns kBlockN keys (hd 256: 80, hd 128: 128); the two consumer warpgroups split the
// keys for S and dP and the head dim for everything else. Per query block of 64 rows:
//   S = Q·Kᵀ, dP = dO·Vᵀ        64 rows × kBlockN/2 keys each (consumer c: its half of the keys)
//   P, dS -> shared memory       both consumers' halves make the block's 64 × kBlockN tiles
//   dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS   hd/2 × kBlockN: the head dim is the M extent, so a key count
//                                that is not a multiple of 64 still makes valid WGMMAs
//   dQ(partial) = dS·K           64 rows × hd/2, in 64-column chunks, added to dq_accum
// so every GEMM is done once per CTA; the price is one named barrier per block and P, dS
// written to shared memory. More keys per CTA means fewer dQ partials: their reduction in
// L2 is what bounds this kernel (80 keys: 0.8× the bytes of 64).
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

template <class Element_, int kHeadDim_, int kStages_, int kBlockN_>
struct BwdWideTraits {
  using Element = Element_;
  using ElementQK = typename BwdElements<Element>::ElementQK;
  using ElementV = typename BwdElements<Element>::ElementV;
  using ElementO = typename BwdElements<Element>::ElementO;
  using ElementGrad = typename BwdElements<Element>::ElementGrad;
  using ElementP = typename BwdElements<Element>::ElementP;
  static constexpr bool kSplitsHeadDim = true;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;  // Q pipeline stages
  static constexpr int kConsumers = 2;
  static constexpr int kBlockN = kBlockN_;  // keys per CTA
  static constexpr int kBlockM = 64;        // query rows per block
  static constexpr int kKeyTiles = 1;       // TMA tiles of K and V per CTA
  static constexpr int kKeysPerConsumer = kBlockN / kConsumers;   // of S and dP
  static constexpr int kColsPerConsumer = kHeadDim / kConsumers;  // of dK, dV and dQ
  static constexpr int kDqChunkCols = 64;                         // dQ columns per GEMM
  static constexpr int kDqChunks = kColsPerConsumer / kDqChunkCols;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;

  // dQ of one query block as a consumer computes it (read back by bwd_dq_convert.h): all rows,
  // one 64-column chunk per region, region = consumer · kDqChunks + chunk.
  static constexpr bool kDqSplitCols = true;
  static constexpr bool kDqSplitRows = false;
  static constexpr bool kDqSplitKeys = false;
  static constexpr int kDqRows = kBlockM;
  static constexpr int kDqCols = kDqChunkCols;
  static constexpr int kDqRegions = kConsumers * kDqChunks;
  static constexpr int kDqElems = kDqRows * kDqCols;
  static constexpr int kDqRegionThreads = 128;

  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using TileS = Shape<Int<kBlockM>, Int<kKeysPerConsumer>>;     // S of one consumer
  using TileDkvT = Shape<Int<kColsPerConsumer>, Int<kBlockN>>;  // dKᵀ or dVᵀ of one consumer
  using TileDq = Shape<Int<kDqRows>, Int<kDqCols>>;

  // Q and dO: (rows, hd, stage), head-dim-major and swizzled as WGMMA reads them; the (hd, rows,
  // stage) view is the MN-major A operand of dKᵀ += Qᵀ·dS and dVᵀ += dOᵀ·P.
  using SmemAtomQ = decltype(gmma_smem_atom<GMMA::Major::K, ElementQK, kHeadDim>());
  template <int kN>
  using SmemLayoutRows = decltype(tile_to_shape(SmemAtomQ{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kN>>{}));
  template <int kN>
  using SmemLayoutRowsT = decltype(composition(
      SmemLayoutRows<kN>{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kN>>{}, Step<_2, _1, _3>{})));
  // dO gets two stages where they fit, else one (hd 256): it is released once dV has read it.
  // The estimate counts the tiles (Q stages, K, V, two P and two dS buffers, dO stages) plus
  // kSmallBytes for the lse/row_dot stages and the barriers; SharedStorage checks the result.
  static constexpr int kSmemLimit = 227 * 1024;  // bytes per block on sm90
  static constexpr int kSmallBytes = 4096;
  static constexpr int kTileBytes = (kStages * kBlockM + 2 * kBlockN) * kHeadDim * int(sizeof(ElementQK)) +
                                    2 * 2 * kBlockM * kBlockN * int(sizeof(ElementP));
  static constexpr int kDoStageBytes = kBlockM * kHeadDim * int(sizeof(ElementO));
  static constexpr int kDoStages = kTileBytes + 2 * kDoStageBytes + kSmallBytes <= kSmemLimit ? 2 : 1;
  using SmemLayoutQ = SmemLayoutRows<kStages>;
  using SmemLayoutQt = SmemLayoutRowsT<kStages>;
  using SmemLayoutDo = SmemLayoutRows<kDoStages>;
  using SmemLayoutDot = SmemLayoutRowsT<kDoStages>;
  // K and V: (keys, hd, 1) (the last mode numbers the CTA's key tiles, as the producer and the
  // launcher expect); (hd, keys, 1) is the MN-major B operand of dQ = dS·K.
  using SmemAtomKV = decltype(gmma_smem_atom<GMMA::Major::K, ElementQK, kHeadDim>());
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtomKV{}, Shape<Int<kBlockN>, Int<kHeadDim>, _1>{}));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, _1>{}, Step<_2, _1, _3>{})));
  // P and dS: (query rows, keys, buffer), keys contiguous: the K-major A operand of dQ = dS·K
  // and where the consumers' registers land. The (keys, rows, buffer) view is the MN-major B
  // operand of dVᵀ and dKᵀ. Two buffers: a consumer writes the next block's tiles while the
  // other may still read this block's.
  // Unswizzled 8 × 8 atoms: a consumer's keys need only be a multiple of 8 (40 for hd 256),
  // stmatrix writes their 128-byte core matrices without bank conflicts, and they measured
  // faster than the 128-byte swizzle where both fit (hd 128: 1.05-1.07 against 1.03-1.06 x
  // cuDNN).
  using SmemAtomPds = GMMA::Layout_K_INTER_Atom<ElementP>;
  using SmemLayoutPds = decltype(tile_to_shape(SmemAtomPds{}, Shape<Int<kBlockM>, Int<kBlockN>, _2>{}));
  using SmemLayoutPdst = decltype(composition(
      SmemLayoutPds{}, make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, _2>{}, Step<_2, _1, _3>{})));

  using TiledMmaSdP = decltype(make_tiled_mma(ss_gmma_op<
      ElementQK, ElementQK, Shape<Int<kBlockM>, Int<kKeysPerConsumer>, Int<kHeadDim>>>()));
  using TiledMmaDkv = decltype(make_tiled_mma(ss_gmma_op<
      ElementQK, ElementP, Shape<Int<kColsPerConsumer>, Int<kBlockN>, Int<kBlockM>>,
      GMMA::Major::MN, GMMA::Major::MN>()));
  using TiledMmaDq = decltype(make_tiled_mma(ss_gmma_op<
      ElementP, ElementQK, Shape<Int<kDqRows>, Int<kDqCols>, Int<kBlockN>>,
      GMMA::Major::K, GMMA::Major::MN>()));
  static_assert(gmma_n_extent<TiledMmaSdP> == kKeysPerConsumer && gmma_n_extent<TiledMmaDkv> == kBlockN &&
                    gmma_n_extent<TiledMmaDq> == kDqCols,
                "one WGMMA spans each GEMM's N (gmma_extra_shapes.h)");
  // stmatrix of P and dS (x4 needs 16 columns per warp and step) and of dKᵀ/dVᵀ, transposed
  // into K's and V's (keys, hd) tiles.
  using SmemCopyAtomPds = std::conditional_t<kKeysPerConsumer % 16 == 0, Copy_Atom<SM90_U32x4_STSM_N, ElementP>,
                                             Copy_Atom<SM90_U32x2_STSM_N, ElementP>>;
  using SmemCopyAtomDkvT = Copy_Atom<SM90_U16x8_STSM_T, ElementGrad>;

  using Tma = BwdTmaTypes<ElementQK, ElementGrad, decltype(SmemLayoutQ{}(_, _, _0{})), TileQ,
                          decltype(SmemLayoutKV{}(_, _, _0{})), TileKV>;
  using TmaQ = typename Tma::TmaQ;
  using TmaKV = typename Tma::TmaKV;
  using TmaDkv = typename Tma::TmaDkv;

  static constexpr int kQElems = cosize_v<SmemLayoutQ>;
  static constexpr int kDoElems = cosize_v<SmemLayoutDo>;
  static constexpr int kKVElems = cosize_v<SmemLayoutKV>;
  static constexpr int kPdsElems = cosize_v<SmemLayoutPds>;
  static constexpr uint32_t kStageBytes = kBlockM * kHeadDim * sizeof(ElementQK) + kBlockM * sizeof(float);
  static constexpr uint32_t kKVBytes = 2 * kBlockN * kHeadDim * sizeof(ElementQK);

  using PipelineQ = cutlass::PipelineTmaAsync<kStages>;
  using PipelineDo = cutlass::PipelineTmaAsync<kDoStages>;

  struct SharedStorage {
    cute::array_aligned<ElementQK, kQElems, 1024> q;
    cute::array_aligned<ElementO, kDoElems, 1024> dout;
    cute::array_aligned<ElementQK, kKVElems, 1024> k;
    cute::array_aligned<ElementV, kKVElems, 1024> v;
    cute::array_aligned<ElementP, kPdsElems, 1024> p;
    cute::array_aligned<ElementP, kPdsElems, 1024> ds;
    cute::array_aligned<float, kStages * kBlockM, 128> lse_log2;
    cute::array_aligned<float, kDoStages * kBlockM, 128> row_dot;
    typename PipelineQ::SharedStorage pipeline_q;
    typename PipelineDo::SharedStorage pipeline_do;
    cutlass::arch::ClusterTransactionBarrier kv_full;  // K and V landed
    int last_part;  // a split tile's part that counted itself last stores dK and dV
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= kSmemLimit, "tile does not fit in shared memory");
  // A consumer's columns are whole swizzle atoms of the head-dim-major tiles (64 elements).
  static_assert(kColsPerConsumer % kDqChunkCols == 0, "the head dim must split into 64-column parts");
  static_assert(kKeysPerConsumer % 8 == 0, "each consumer's keys must be a WGMMA N extent");
};

}  // namespace flashcute::hopper
