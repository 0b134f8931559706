// Persistent tile order of the Hopper-path forward. Round r hands CTA i the tile
// r * gridDim.x + i, or with causal on odd rounds r * gridDim.x + (gridDim.x - 1 - i): in a
// longest-first order the CTA that got the longest tile of one round gets the shortest of
// the next, so per-CTA totals stay even when each CTA only sees a few tiles.
//
// Tiles are grouped by (batch, head) so that the CTAs running at once share few K/V heads
// (their K/V stays in L2); inside a group the order is query-block-major, and with causal
// from the block with the most keys to the one with the fewest, so long tiles start first
// and short ones fill the tail.
#pragma once

#include <cute/config.hpp>

namespace flashcute::hopper {

struct FwdTile {
  int m_block;
  int head;
  int batch;
};

struct TileSchedule {
  int num_m_blocks;
  int nheads;
  int num_head_batch;  // nheads * batch
  int group_size;      // (batch, head) pairs per group
  int num_tiles;
  bool longest_first;

  // The tile CTA `cta` of `ctas` runs in round `round` (may be >= num_tiles: no more work).
  CUTE_HOST_DEVICE int index(int round, int cta, int ctas) const {
    const int slot = longest_first && (round & 1) ? ctas - 1 - cta : cta;
    return round * ctas + slot;
  }

  CUTE_HOST_DEVICE FwdTile tile(int index) const {
    const int group_tiles = group_size * num_m_blocks;
    const int group = index / group_tiles;
    const int in_group = index - group * group_tiles;
    const int first = group * group_size;
    const int heads_in_group = num_head_batch - first < group_size ? num_head_batch - first : group_size;
    const int rank = in_group / heads_in_group;
    const int head_batch = first + in_group - rank * heads_in_group;
    const int m_block = longest_first ? num_m_blocks - 1 - rank : rank;
    return FwdTile{m_block, head_batch % nheads, head_batch / nheads};
  }
};

}  // namespace flashcute::hopper
