// Kernel arguments of the Hopper-path forward: the shared launch arguments plus the TMA
// descriptors (built on the host, read from the __grid_constant__ parameter space), the
// persistent tile schedule and the workspace of a split last wave.
#pragma once

#include "hopper/fwd_traits.h"
#include "hopper/seq_rows.h"
#include "hopper/tile_scheduler.h"
#include "kernel_params.h"
#include "mask.h"
#include "paged_kernels.h"
#include "seq_view.h"

namespace flashcute::hopper {

template <class Traits>
struct FwdParams {
  FwdKernelParams args;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaK tma_k;
  typename Traits::TmaV tma_v;
  typename Traits::TmaO tma_o;
  TileSchedule schedule;
  // Rows of K/V's tensor maps: seqlen_k, total_k where keys are packed (cu_seqlens_k), or 1
  // when there are none (a TMA dimension cannot be 0).
  int tma_seqlen_k;
  // Causal: query tiles start this many rows (whole 64-row consumer blocks) before row 0, so a
  // partial tile is the first, the one that sees the fewest keys, not the last (tile_row0).
  // Packed queries: each sequence's own, from its length (seq_tile).
  int row_shift;
  int nheads_kv;
  // The split tiles' counts and pieces' states (fwd_tail_split.h); null without a split.
  int* split_count;
  float* split_state;
  // Query heads packed per row block (fwd_packed_heads.h), 1 if none; args is then the packed
  // call, and Q and O go through these tensor maps: (head dim, G heads, seqlen_q, K/V head,
  // batch), boxes of (64 columns, G, 64 / G rows).
  int packed_heads;
  cute::TmaDescriptor tma_q_packed;
  cute::TmaDescriptor tma_o_packed;
  // A paged KV cache (args.page_table not null): K and V through these tensor maps, boxes of
  // paged_box_rows keys inside one page (fwd_paged_kv.h).
  cute::TmaDescriptor tma_k_paged;
  cute::TmaDescriptor tma_v_paged;
  int paged_box_rows;
};

// Kernels that read paged KV caches (paged_kernels.h): 16-bit ones of whole 64-column slabs.
template <class Traits>
constexpr bool kReadsPages =
    !Traits::kTransposesV && Traits::kBlockN % 16 == 0 && hopper_reads_pages(Traits::kHeadDim, Traits::kHeadDimV, 16);

// Head dims whose calls may pack query heads (fwd_packed_heads): whole 128-byte swizzle columns.
template <class Traits>
constexpr bool kPacksQueryHeads = Traits::kHeadDim % 64 == 0 && Traits::kHeadDimV % 64 == 0 && !Traits::kTransposesV;

// Packed query heads: where consumer c's TMA box of head-dim columns [col, col + 64) lies in
// Q's buffer (of kHeadDim columns) or O's staging (kHeadDimV), both laid out alike. The box is
// 64 rows of 128 bytes, which the layout stacks as eight 8-row swizzle atoms, so the box lands
// exactly as a 2-d one would.
template <class SmemLayout, class Element, int kCols>
CUTE_HOST_DEVICE constexpr int packed_box_offset_in(int c, int col) {
  // Offsets before the swizzle, which TMA applies to the box as it does to the unpacked one.
  constexpr auto layout = cute::get_nonswizzle_portion(SmemLayout{});
  constexpr int kNextColumns = 64 % kCols;  // 0 at 64 columns
  static_assert(kCols % 64 == 0 && sizeof(Element) == 2);
  static_assert(layout(1, 0, 0) == 64 && layout(8, 0, 0) == 8 * 64 && layout(0, kNextColumns, 0) == kNextColumns * 64 &&
                layout(0, 0, 1) == 64 * kCols, "a buffer of 64 x 64 blocks of 128-byte rows");
  return c * 64 * kCols + col * 64;
}
template <class Traits>
CUTE_HOST_DEVICE constexpr int packed_box_offset(int c, int col) {
  return packed_box_offset_in<typename Traits::SmemLayoutQ, typename Traits::ElementQK, Traits::kHeadDim>(c, col);
}
template <class Traits>
CUTE_HOST_DEVICE constexpr int packed_o_box_offset(int c, int col) {
  return packed_box_offset_in<typename Traits::SmemLayoutO, typename Traits::ElementO, Traits::kHeadDimV>(c, col);
}

// Where a tile row lives in the caller's Q, O and LSE: with packed query heads (G > 1), tile
// row r of K/V head h is query row r / G of query head h·G + r % G.
struct QueryRowOf {
  int head, row;
};
template <class Traits>
CUTE_HOST_DEVICE QueryRowOf query_row_of(FwdParams<Traits> const& params, int tile_head, int tile_row) {
  const int group = params.packed_heads;
  if (group > 1) return {tile_head * group + tile_row % group, tile_row / group};
  return {tile_head, tile_row};
}

// First query row of tile m_block; negative for a shifted first tile. Its 64-row blocks before
// row 0 are neither loaded, computed nor stored.
template <class Traits>
CUTE_HOST_DEVICE int tile_row0(FwdParams<Traits> const& params, int m_block) {
  return m_block * Traits::kBlockM - params.row_shift;
}

// A scheduled tile in its sequence: the query tile it runs there and the rows by which that
// sequence's tiles start before row 0 (row0() at or past seqlen_q: nothing of the sequence).
template <class Traits>
struct SeqTile {
  int m_block;
  int row_shift;
  CUTE_HOST_DEVICE int row0() const { return m_block * Traits::kBlockM - row_shift; }
};

// Causal pairs in a batch of packed queries (cu_seqlens_q): the schedule's pairs (M-1-r, r) are
// laid out from the longest sequence's M tiles; a sequence of M_b tiles runs (M_b-1-r, r)
// instead, so its pairs cost the same, and its own row shift. Its pair ranks r past
// (M_b-1) / 2 have no tile left (M_b-1-r < r, or r is its middle tile again): those tiles are
// placed past the sequence and skipped by producer and consumers alike. Equal lengths give the
// fixed-length schedule. Otherwise (fixed lengths, unpaired tiles) the tile as scheduled.
template <class Traits>
CUTE_DEVICE SeqTile<Traits> seq_tile(FwdParams<Traits> const& params, int m_block, int seqlen_q) {
  constexpr int kBlockM = Traits::kBlockM;
  if (!params.schedule.paired || params.args.cu_seqlens_q == nullptr) return {m_block, params.row_shift};
  const int tiles = params.schedule.num_m_blocks;
  const int seq_tiles = (seqlen_q + kBlockM - 1) / kBlockM;
  // As fwd_launch.h's row_shift: the rows a partial last tile leaves, in whole 64-row blocks.
  const int shift = (seq_tiles * kBlockM - seqlen_q) / Traits::kRowsPerConsumer * Traits::kRowsPerConsumer;
  const SeqTile<Traits> none{seq_tiles, shift};  // past the sequence
  if (2 * m_block >= tiles - 1) {  // a pair's first tile M-1-r (or an odd M's middle one)
    const int rank = tiles - 1 - m_block;
    const int mine = seq_tiles - 1 - rank;
    return mine >= rank ? SeqTile<Traits>{mine, shift} : none;
  }
  return 2 * m_block + 1 < seq_tiles ? SeqTile<Traits>{m_block, shift} : none;  // its second tile r
}

// The key blocks [n_begin, n_end) a scheduled tile loads, in its sequence (none where the
// tile is past the sequence's query rows): its mask's range, a split piece's share of it.
struct TileKeyBlocks {
  int n_begin, n_end;
};
template <class Traits>
CUTE_DEVICE TileKeyBlocks tile_key_blocks(FwdParams<Traits> const& params, FwdTile const& tile, SeqView const& view) {
  const int row0 = seq_tile(params, tile.m_block, view.seqlen_q).row0();
  if (row0 >= view.seqlen_q) return {0, 0};
  const KeyBlockRange range = key_block_range<Traits::kBlockN>(view.mask(params.args), row0, Traits::kBlockM);
  return {cute::max(range.n_begin, tile.key_begin), cute::min(range.n_end, tile.key_end)};
}

}  // namespace flashcute::hopper
