// Kernel arguments of the Hopper-path backward: the shared launch arguments plus the TMA
// descriptors (built on the host, read from the __grid_constant__ parameter space).
#pragma once

#include <cute/config.hpp>

#include "bwd_tail_split.h"
#include "hopper/seq_rows.h"
#include "kernel_params.h"
#include "mask.h"
#include "seq_view.h"

namespace flashcute::hopper {

template <class Traits>
struct BwdParams {
  BwdKernelParams args;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaQ tma_do;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  typename Traits::TmaDkv tma_dk;
  typename Traits::TmaDkv tma_dv;
  // Rows of Q's and dO's tensor maps: seqlen_q, total_q where queries are packed
  // (cu_seqlens_q), or 1 when there are none (a TMA dimension cannot be 0).
  int tma_seqlen_q;
  int pair_begin;    // first (batch, kv head) pair of this launch's dq_accum chunk
  BwdTailSplit split;  // CTA -> tile (and part) of this launch
};

// One CTA's work: key block n_block of (batch, kv_head), the pair's slot in the chunk, and of
// the walk over its query blocks (heads_per_kv heads × the key block's query-block range, head
// after head) blocks [block_begin, block_end): all of them unless the tile is split.
struct BwdTile {
  int n_block, pair_slot, batch, kv_head;
  int block_begin, block_end;
  int split;  // split tile index (bwd_tail_split.h), -1 when this CTA does the whole tile
};

// The work of CTA `cta`. Tiles go pair by pair, key blocks in order (causal: low key blocks
// meet the most rows and start first; the last pairs key block by key block, plan_causal_tail).
// In a variable-length batch the query blocks are those of the pair's sequence (seq_view.h); a
// key block past the sequence's keys meets none.
template <class Traits>
CUTE_DEVICE BwdTile bwd_tile(BwdParams<Traits> const& params, int cta) {
  const BwdKernelParams& args = params.args;
  const BwdTailSplit::Work work = params.split.work(cta);
  BwdTile tile;
  tile.n_block = work.tile % params.split.key_blocks;
  tile.pair_slot = work.tile / params.split.key_blocks;
  const int pair = params.pair_begin + tile.pair_slot;
  tile.batch = pair / args.nheads_kv;
  tile.kv_head = pair % args.nheads_kv;
  const QueryBlockRange range =
      query_block_range<Traits::kBlockM, Traits::kBlockN>(SeqView::of(args, tile.batch).mask(args),
                                                          tile.n_block * Traits::kBlockN);
  const int blocks = args.heads_per_kv * range.count();
  tile.split = work.split;
  tile.block_begin = work.split < 0 ? 0 : part_block_begin(blocks, work.part, params.split.parts);
  tile.block_end = work.split < 0 ? blocks : part_block_begin(blocks, work.part + 1, params.split.parts);
  return tile;
}

// blockIdx.x, read again: a CTA's epilogue decodes its tile anew instead of keeping it in
// registers through the main loop (volatile, so that the compiler does not merge the reads).
CUTE_DEVICE int cta_index_again() {
  int cta;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
  return cta;
}

}  // namespace flashcute::hopper
