// Producer warp of the Hopper-path backward: one thread issues every load of a CTA.
//
// K and V of the CTA's key block once (one transaction barrier), then per (head of the GQA
// group, query block) of the CTA's share of the walk (BwdTile) a Q stage and a dO stage, each
// a TMA tile plus a bulk copy of the block's lse_log2 (or row_dot) values from the padded
// workspace onto the same barrier. In a variable-length batch Q, dO, K and V are read at the
// sequence's start (seq_view.h; packed sides); the workspace rows stay per sequence.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>

#include "hopper/bwd_params.h"
#include "mask.h"
#include "seq_view.h"

namespace flashcute::hopper {

template <class Traits>
CUTE_DEVICE void produce_bwd(BwdParams<Traits> const& params, typename Traits::SharedStorage& storage,
                             typename Traits::PipelineQ& pipeline_q, typename Traits::PipelineDo& pipeline_do,
                             BwdTile const& tile) {
  using namespace cute;
  using PipelineQ = typename Traits::PipelineQ;
  const int n_block = tile.n_block, kv_head = tile.kv_head, batch = tile.batch;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  const BwdKernelParams& args = params.args;

  Tensor mQ = params.tma_q.get_tma_tensor(make_shape(params.tma_seqlen_q, kHeadDim, args.nheads, args.batch));
  Tensor mdO = params.tma_do.get_tma_tensor(make_shape(params.tma_seqlen_q, kHeadDim, args.nheads, args.batch));
  Tensor mK = params.tma_k.get_tma_tensor(make_shape(args.seqlen_k, kHeadDim, args.nheads_kv, args.batch));
  Tensor mV = params.tma_v.get_tma_tensor(make_shape(args.seqlen_k, kHeadDim, args.nheads_kv, args.batch));
  Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(storage.dout.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutKV{});
  auto tma_q = params.tma_q.get_slice(_0{});
  auto tma_do = params.tma_do.get_slice(_0{});
  auto tma_k = params.tma_k.get_slice(_0{});
  auto tma_v = params.tma_v.get_slice(_0{});

  const SeqView view = SeqView::of(args, batch);
  // K and V: kKeyTiles tiles of 64 keys.
  {
    const int k_batch = tma_batch(args.cu_seqlens_k, batch);
    Tensor tKgK = tma_k.partition_S(local_tile(domain_offset(make_coord(view.k_start, _0{}), mK(_, _, kv_head, k_batch)),
                                               typename Traits::TileKV{}, make_coord(_, _0{})));
    Tensor tVgV = tma_v.partition_S(local_tile(domain_offset(make_coord(view.k_start, _0{}), mV(_, _, kv_head, k_batch)),
                                               typename Traits::TileKV{}, make_coord(_, _0{})));
    Tensor tKsK = tma_k.partition_D(sK);
    Tensor tVsV = tma_v.partition_D(sV);
    storage.kv_full.arrive_and_expect_tx(Traits::kKVBytes);
    auto& barrier = reinterpret_cast<uint64_t&>(storage.kv_full);
    CUTE_UNROLL
    for (int t = 0; t < Traits::kKeyTiles; ++t) {
      copy(params.tma_k.with(barrier), tKgK(_, _, _, n_block * Traits::kKeyTiles + t), tKsK(_, _, _, t));
      copy(params.tma_v.with(barrier), tVgV(_, _, _, n_block * Traits::kKeyTiles + t), tVsV(_, _, _, t));
    }
  }

  Tensor tQsQ = tma_q.partition_D(sQ);     // (TMA, ..., stage)
  Tensor tdOsdO = tma_do.partition_D(sdO);
  const QueryBlockRange range =
      query_block_range<kBlockM, Traits::kBlockN>(view.mask(args), n_block * Traits::kBlockN);
  const int q_batch = tma_batch(args.cu_seqlens_q, batch);
  auto q_state = cutlass::make_producer_start_state<PipelineQ>();
  auto do_state = cutlass::make_producer_start_state<typename Traits::PipelineDo>();
  const int count = range.count();
  for (int t = tile.block_begin; t < tile.block_end;) {  // head by head
    const int g = t / count;
    const int h = kv_head * args.heads_per_kv + g;
    const int i_end = min(count, tile.block_end - g * count);
    Tensor tQgQ = tma_q.partition_S(local_tile(domain_offset(make_coord(view.q_start, _0{}), mQ(_, _, h, q_batch)),
                                               typename Traits::TileQ{}, make_coord(_, _0{})));
    Tensor tdOgdO = tma_do.partition_S(local_tile(domain_offset(make_coord(view.q_start, _0{}), mdO(_, _, h, q_batch)),
                                                  typename Traits::TileQ{}, make_coord(_, _0{})));
    const int64_t rows = (int64_t(batch) * args.nheads + h) * args.seqlen_q_padded;
    // Not unrolled: unrolled copies of this loop do not fit in the producer's 24 registers.
    CUTE_NO_UNROLL
    for (int i = t - g * count; i < i_end; ++i) {
      const int m = range.at(i);  // the consumers' order
      pipeline_q.producer_acquire(q_state);
      uint64_t* q_barrier = pipeline_q.producer_get_barrier(q_state);
      copy(params.tma_q.with(*q_barrier), tQgQ(_, _, _, m), tQsQ(_, _, _, q_state.index()));
      SM90_BULK_COPY_G2S::copy(args.lse_log2 + rows + m * kBlockM, q_barrier,
                               storage.lse_log2.data() + q_state.index() * kBlockM, kBlockM * sizeof(float));
      ++q_state;

      pipeline_do.producer_acquire(do_state);
      uint64_t* do_barrier = pipeline_do.producer_get_barrier(do_state);
      copy(params.tma_do.with(*do_barrier), tdOgdO(_, _, _, m), tdOsdO(_, _, _, do_state.index()));
      SM90_BULK_COPY_G2S::copy(args.row_dot + rows + m * kBlockM, do_barrier,
                               storage.row_dot.data() + do_state.index() * kBlockM, kBlockM * sizeof(float));
      ++do_state;
    }
    t = g * count + i_end;
  }
}

}  // namespace flashcute::hopper
