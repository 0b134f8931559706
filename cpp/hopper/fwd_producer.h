// Producer warp of the Hopper-path forward: one thread issues every TMA load of a CTA.
//
// Per tile: the first K block, then Q (once the consumers released the previous tile's Q),
// then K of the next block ahead of V of the current one, so S = Q·Kᵀ of block n-1 never waits
// behind V of block n. Where O is staged in V's buffer, the first V load of a tile waits for
// the previous tile's O stores. With packed query heads, Q comes through its own tensor map
// (fwd_packed_heads.h). Key blocks go from the last to the first, as the consumers visit
// them; a piece of a split tile (tile_scheduler.h) loads its own key blocks only. In a
// variable-length batch a tile's rows and keys are its sequence's (seq_view.h): packed sides
// are read at the sequence's start, and tiles past the sequence's query rows are skipped
// (causal pairs and row shift per sequence: seq_tile, fwd_params.h). A paged KV cache's blocks
// come box by box from their pages (fwd_paged_kv.h).
#pragma once

#include <cute/tensor.hpp>

#include "hopper/fwd_paged_kv.h"
#include "hopper/fwd_params.h"
#include "kv_rows.h"
#include "mask.h"
#include "seq_view.h"

namespace flashcute::hopper {

template <class Traits>
CUTE_DEVICE void produce_fwd(FwdParams<Traits> const& params, typename Traits::SharedStorage& storage,
                             typename Traits::PipelineKV& pipeline_k,
                             typename Traits::PipelineKV& pipeline_v) {
  using namespace cute;
  using PipelineKV = typename Traits::PipelineKV;
  constexpr int kRows = Traits::kRowsPerConsumer;
  const FwdKernelParams& args = params.args;

  Tensor mQ = params.tma_q.get_tma_tensor(make_shape(args.seqlen_q, int(Traits::kHeadDim), args.nheads, args.batch));
  Tensor mK = params.tma_k.get_tma_tensor(make_shape(params.tma_seqlen_k, int(Traits::kHeadDim), params.nheads_kv, args.batch));
  Tensor mV = params.tma_v.get_tma_tensor(make_shape(params.tma_seqlen_k, int(Traits::kHeadDimV), params.nheads_kv, args.batch));
  Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutV{});
  auto tma_q = params.tma_q.get_slice(_0{});
  auto tma_k = params.tma_k.get_slice(_0{});
  auto tma_v = params.tma_v.get_slice(_0{});
  Tensor tQsQ = tma_q.partition_D(sQ);  // (TMA, ..., consumer)
  Tensor tKsK = tma_k.partition_D(sK);  // (TMA, ..., stage)
  Tensor tVsV = tma_v.partition_D(sV);

  if (args.after_kv_copy) asm volatile("griddepcontrol.wait;" ::: "memory");  // K/V are the copy's output
  auto k_state = cutlass::make_producer_start_state<PipelineKV>();
  auto v_state = cutlass::make_producer_start_state<PipelineKV>();
  int iteration = 0;  // tiles run (a variable-length batch skips those past their sequence)
  TileWalk<Traits::kClaimsTiles, true, Traits::kWalksHoldUnit, Traits::kSplitsTiles> walk(params.schedule,
                                                                                         storage.claims);
  for (; walk.valid(); walk.advance()) {
    const FwdTile tile = walk.tile();
    const SeqView view = SeqView::of(args, tile.batch);
    const SeqTile<Traits> place = seq_tile(params, tile.m_block, view.seqlen_q);  // causal pairs per sequence
    const int row0 = place.row0();
    if (row0 >= view.seqlen_q) continue;  // the consumers skip it too
    walk.publish(iteration);  // claimed order: the consumers' tile `iteration`
    const int kv_head = tile.head / args.heads_per_kv;
    const TileKeyBlocks blocks = tile_key_blocks(params, tile, view);  // a split piece: its own only
    const int n_begin = blocks.n_begin, n_end = blocks.n_end;
    // (TMA, ..., 64-row block): block b starts at row 64 b - row_shift
    // Packed sides: the sequence's rows start at q_start / k_start of one batch (seq_view.h).
    const int q_batch = tma_batch(args.cu_seqlens_q, tile.batch);
    const int k_batch = tma_batch(args.cu_seqlens_k, tile.batch);
    Tensor tQgQ = tma_q.partition_S(local_tile(domain_offset(make_coord(view.q_start - place.row_shift, _0{}),
                                                             mQ(_, _, tile.head, q_batch)),
                                               typename Traits::TileQ{}, make_coord(_, _0{})));
    Tensor tKgK = tma_k.partition_S(local_tile(domain_offset(make_coord(view.k_start, _0{}), mK(_, _, kv_head, k_batch)),
                                               typename Traits::TileK{}, make_coord(_, _0{})));  // (TMA, ..., key block)
    Tensor tVgV = tma_v.partition_S(local_tile(domain_offset(make_coord(view.k_start, _0{}), mV(_, _, kv_head, k_batch)),
                                               typename Traits::TileV{}, make_coord(_, _0{})));
    const KvRows kv_rows = KvRows::of(args, tile.batch);
    using Pages = PagedBlock<Traits::kBlockN>;
    // A paged cache's table entries for key block n (fwd_paged_kv.h), read before the wait.
    auto read_pages = [&](int n) {
      Pages pages{};
      if constexpr (kReadsPages<Traits>)
        if (kv_rows.paged()) pages = Pages::read(kv_rows, n, params.paged_box_rows, args.seqlen_k);
      return pages;
    };
    // Key block n of a paged cache into stage `stage` of K's or V's buffer; false: not paged.
    auto load_paged = [&](bool values, uint64_t* barrier, int stage, Pages const& pages) {
      if constexpr (kReadsPages<Traits>) {
        if (kv_rows.paged()) {
          if (values)
            load_paged_block<typename Traits::SmemLayoutV, Traits::kBlockN, Traits::kHeadDimV>(
                params.tma_v_paged, barrier, storage.v.data(), stage, kv_rows, pages, kv_head);
          else
            load_paged_block<typename Traits::SmemLayoutK, Traits::kBlockN, Traits::kHeadDim>(
                params.tma_k_paged, barrier, storage.k.data(), stage, kv_rows, pages, kv_head);
          return true;
        }
      }
      return false;
    };
    auto load_k = [&](int n) {
      const Pages pages = read_pages(n);
      pipeline_k.producer_acquire(k_state);
      uint64_t* barrier = pipeline_k.producer_get_barrier(k_state);
      if (!load_paged(false, barrier, k_state.index(), pages))
        copy(params.tma_k.with(*barrier), tKgK(_, _, _, n), tKsK(_, _, _, k_state.index()));
      ++k_state;
    };
    // O staged in V's buffer: the previous tile's O stores must have read it (one phase per tile).
    bool o_buffer_free = iteration == 0 || !Traits::kOAliasesV;
    auto wait_o_buffer = [&] {
      if (!o_buffer_free) storage.o_empty.wait((iteration - 1) & 1);
      o_buffer_free = true;
    };
    auto load_v = [&](int n) {
      const Pages pages = read_pages(n);
      wait_o_buffer();
      pipeline_v.producer_acquire(v_state);
      uint64_t* barrier = pipeline_v.producer_get_barrier(v_state);
      if (!load_paged(true, barrier, v_state.index(), pages))
        copy(params.tma_v.with(*barrier), tVgV(_, _, _, n), tVsV(_, _, _, v_state.index()));
      ++v_state;
    };

    int n = n_end - 1;
    if (n >= n_begin) load_k(n);
    if (iteration > 0) storage.q_empty.wait((iteration - 1) & 1);
    // A shifted first tile: its 64-row blocks before row 0 stay unloaded (their consumers skip them).
    const int first_block = place.m_block * Traits::kConsumers;
    const int skipped = place.m_block == 0 ? place.row_shift / kRows : 0;
    storage.q_full.arrive_and_expect_tx(Traits::kQBytes / Traits::kConsumers * (Traits::kConsumers - skipped));
    bool q_loaded = false;
    if constexpr (kPacksQueryHeads<Traits>) {
      if (params.packed_heads > 1) {
        // Block b: query rows [b · 64 / G, (b + 1) · 64 / G) of the group's G heads.
        const int rows_per_box = kRows / params.packed_heads;
        CUTE_UNROLL
        for (int c = 0; c < Traits::kConsumers; ++c) {
          CUTE_UNROLL
          for (int col = 0; col < Traits::kHeadDim; col += 64)
            SM90_TMA_LOAD_5D::copy(&params.tma_q_packed, reinterpret_cast<uint64_t*>(&storage.q_full),
                                   static_cast<uint64_t>(TMA::CacheHintSm90::EVICT_NORMAL),
                                   storage.q.data() + packed_box_offset<Traits>(c, col), col, 0,
                                   (first_block + c) * rows_per_box, tile.head, tile.batch);
        }
        q_loaded = true;
      }
    }
    if (!q_loaded) {
      CUTE_UNROLL
      for (int c = 0; c < Traits::kConsumers; ++c) {
        if (c >= skipped)
          copy(params.tma_q.with(reinterpret_cast<uint64_t&>(storage.q_full)), tQgQ(_, _, _, first_block + c),
               tQsQ(_, _, _, c));
      }
    }
    for (; n > n_begin; --n) {
      load_k(n - 1);
      load_v(n);
    }
    if (n == n_begin) load_v(n);
    wait_o_buffer();  // tiles without key blocks still complete a phase
    ++iteration;
  }
  walk.publish(iteration);  // claimed order: the end
}

}  // namespace flashcute::hopper
