// TMA pieces shared by both Hopper-path backward designs (bwd_traits.h, bwd_wide_traits.h):
// the descriptor types of the Q/dO and K/V loads and the dK/dV stores, and the store itself.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>

namespace flashcute::hopper {

using namespace cute;

// Global tensors as TMA sees them: (seqlen, hd, heads, batch), unit stride along hd. One Q (or
// dO) stage and one 64-key K/V tile per copy.
template <class Element, class SmemTileQ, class TileQ, class SmemTileKV, class TileKV>
struct BwdTmaTypes {
  using GmemLayout = Layout<Shape<int32_t, int32_t, int32_t, int32_t>, Stride<int64_t, _1, int64_t, int64_t>>;
  using GmemIn = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}));
  using GmemOut = decltype(make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), GmemLayout{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemIn{}, SmemTileQ{}, TileQ{}, _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemIn{}, SmemTileKV{}, TileKV{}, _1{}));
  using TmaDkv = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemOut{}, SmemTileKV{}, TileKV{}, _1{}));
};

// One thread: dK and dV of key tile `tile` (TileKV rows of seqlen_k, clipped at its end) from
// shared memory to global memory; returns once shared memory may be reused.
template <class Traits, class Params, class SmemTile>
CUTE_DEVICE void store_dkv_tile(Params const& params, SmemTile const& sdK, SmemTile const& sdV, int tile,
                                int kv_head, int batch) {
  constexpr int kHeadDim = Traits::kHeadDim;
  const auto& args = params.args;
  const auto shape = make_shape(args.seqlen_k, kHeadDim, args.nheads_kv, args.batch);
  Tensor gdK = local_tile(params.tma_dk.get_tma_tensor(shape)(_, _, kv_head, batch), typename Traits::TileKV{},
                          make_coord(tile, _0{}));
  Tensor gdV = local_tile(params.tma_dv.get_tma_tensor(shape)(_, _, kv_head, batch), typename Traits::TileKV{},
                          make_coord(tile, _0{}));
  auto tma_dk = params.tma_dk.get_slice(_0{});
  auto tma_dv = params.tma_dv.get_slice(_0{});
  copy(params.tma_dk, tma_dk.partition_S(sdK), tma_dk.partition_D(gdK));
  copy(params.tma_dv, tma_dv.partition_S(sdV), tma_dv.partition_D(gdV));
  tma_store_arrive();
  tma_store_wait<0>();  // shared memory must outlive every bulk read of it
}

}  // namespace flashcute::hopper
