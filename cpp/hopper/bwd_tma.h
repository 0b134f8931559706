// TMA pieces shared by both Hopper-path backward designs (bwd_traits.h, bwd_wide_traits.h):
// the descriptor types of the Q/dO and K/V loads and the dK/dV stores, and the store itself.
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>

#include "hopper/seq_rows.h"
#include "seq_view.h"

namespace flashcute::hopper {

using namespace cute;

// Global tensors as TMA sees them: (seqlen, hd, heads, batch), unit stride along hd. One Q (or
// dO) stage and one 64-key K/V tile per copy; loads of ElementIn, the dK/dV stores of ElementOut.
template <class ElementIn, class ElementOut, class SmemTileQ, class TileQ, class SmemTileKV, class TileKV>
struct BwdTmaTypes {
  using GmemLayout = Layout<Shape<int32_t, int32_t, int32_t, int32_t>, Stride<int64_t, _1, int64_t, int64_t>>;
  using GmemIn = decltype(make_tensor(make_gmem_ptr(static_cast<ElementIn const*>(nullptr)), GmemLayout{}));
  using GmemOut = decltype(make_tensor(make_gmem_ptr(static_cast<ElementOut*>(nullptr)), GmemLayout{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemIn{}, SmemTileQ{}, TileQ{}, _1{}));
  using TmaKV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemIn{}, SmemTileKV{}, TileKV{}, _1{}));
  using TmaDkv = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemOut{}, SmemTileKV{}, TileKV{}, _1{}));
};

// dK and dV of key tile `tile` (TileKV rows of the sequence's keys) from shared memory to
// global memory, called by all `threads` threads that wrote the tiles (this one is `thread`):
// thread 0 stores both with TMA (clipped at the tensor's end). Where keys are packed
// (cu_seqlens_k) and the tile reaches past the sequence's key rows, which belong to the next
// sequence, every thread stores its share of the sequence's rows instead. Returns once
// shared memory may be reused.
template <class Traits, class Params, class SmemTile>
CUTE_DEVICE void store_dkv_tile(Params const& params, SmemTile const& sdK, SmemTile const& sdV, int tile,
                                int kv_head, int batch, int thread, int threads) {
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kRows = decltype(size<0>(typename Traits::TileKV{}))::value;
  const auto& args = params.args;
  const SeqView view = SeqView::of(args, batch);
  const int row0 = tile * kRows;
  if (args.cu_seqlens_k != nullptr && row0 + kRows > view.k_rows) {
    using Element = typename Traits::ElementGrad;
    const int64_t first = int64_t(view.k_start + row0);
    store_tile_rows(sdK, static_cast<Element*>(args.dk) + kv_head * args.dk_head_stride + first * args.dk_row_stride,
                    args.dk_row_stride, view.k_rows - row0, args.headdim, thread, threads);
    store_tile_rows(sdV, static_cast<Element*>(args.dv) + kv_head * args.dv_head_stride + first * args.dv_row_stride,
                    args.dv_row_stride, view.k_rows - row0, args.headdim_v, thread, threads);
    return;
  }
  if (thread != 0) return;
  const auto shape = make_shape(args.seqlen_k, kHeadDim, args.nheads_kv, args.batch);
  const int k_batch = tma_batch(args.cu_seqlens_k, batch);
  const auto start = make_coord(view.k_start, _0{});  // the sequence's first key row
  Tensor gdK = local_tile(domain_offset(start, params.tma_dk.get_tma_tensor(shape)(_, _, kv_head, k_batch)),
                          typename Traits::TileKV{}, make_coord(tile, _0{}));
  Tensor gdV = local_tile(domain_offset(start, params.tma_dv.get_tma_tensor(shape)(_, _, kv_head, k_batch)),
                          typename Traits::TileKV{}, make_coord(tile, _0{}));
  auto tma_dk = params.tma_dk.get_slice(_0{});
  auto tma_dv = params.tma_dv.get_slice(_0{});
  copy(params.tma_dk, tma_dk.partition_S(sdK), tma_dk.partition_D(gdK));
  copy(params.tma_dv, tma_dv.partition_S(sdV), tma_dv.partition_D(gdV));
  tma_store_arrive();
  tma_store_wait<0>();  // shared memory must outlive every bulk read of it
}

}  // namespace flashcute::hopper
