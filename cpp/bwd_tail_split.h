// The dK/dV kernel's last wave, split (Hopper path, without causal masking). Every dK/dV CTA
// of a non-causal call has the same work, so when the CTA count T is not a multiple of the
// SM count S, the last r = T mod S CTAs run alone while S - r SMs idle (2048 CTAs on 132 SMs:
// 68 of them). Those r tiles (the last ones in launch order) instead run as `parts` CTAs each,
// every part walking a contiguous share of the tile's query blocks; the parts add their fp32
// dK and dV into the workspace (dkv_accum), and the part that finishes last reads the sum
// back and stores dK and dV.
//
// Launch order is tile order, then the parts: tiles [0, full_tiles) one CTA each, then
// split_tiles tiles of `parts` CTAs. A tile is (pair of the chunk) · key_blocks + key block.
#pragma once

#include "host_device.h"  // plain C++ as well: the host API sizes the workspace from it

namespace flashcute {

constexpr int kBwdMaxSplitTiles = 144;  // above the SM count of any Hopper GPU, less one
constexpr int kBwdMaxSplitParts = 16;

struct BwdTailSplit {
  int key_blocks = 1;
  int full_tiles = 0;
  int split_tiles = 0;
  int parts = 1;

  FLASHCUTE_HOST_DEVICE int ctas() const { return full_tiles + split_tiles * parts; }

  // The tile, its part and its split tile index (-1: not split) of CTA `cta`.
  struct Work {
    int tile, part, split;
  };
  FLASHCUTE_HOST_DEVICE Work work(int cta) const {
    if (cta < full_tiles) return Work{cta, 0, -1};
    const int split = (cta - full_tiles) / parts;
    return Work{full_tiles + split, (cta - full_tiles) % parts, split};
  }

  // CTAs of pair slot `pair` (of the chunk) that count themselves done in dq_ready.
  FLASHCUTE_HOST_DEVICE int ctas_of_pair(int pair) const {
    const int first = pair * key_blocks, last = first + key_blocks;  // the pair's tiles
    const int split_first = first > full_tiles ? first : full_tiles;
    const int split = last > split_first ? last - split_first : 0;
    return key_blocks + split * (parts - 1);
  }
};

// Blocks [begin, end) of a tile's `blocks` query blocks that part `part` of `parts` walks.
FLASHCUTE_HOST_DEVICE int part_block_begin(int blocks, int part, int parts) {
  return static_cast<int>(static_cast<long long>(blocks) * part / parts);
}

// Host: the split for T = tiles CTAs of `blocks_per_tile` query blocks each on `sms` SMs, at
// most `max_split_tiles` split. The dQ conversion (launched behind the dK/dV kernel) already
// runs on the SMs the last wave leaves idle: `convert_blocks` is its work in units of one
// query block of a dK/dV CTA. Only the idle time it leaves is there to win: no split unless
// that is 0.3 of a tile (hd 64 at 4k, just below 0.3, measured even with a split). Then the
// part count that minimizes the last wave's length, counting each extra part's start and end
// (K/V load, fp32 dK/dV adds) as kPartCostBlocks query blocks; no split unless that saves a
// tenth of a tile (nor of tiles with fewer than two query blocks, e.g. without queries).
inline BwdTailSplit plan_tail_split(int key_blocks, int tiles, int blocks_per_tile, int sms, int max_split_tiles,
                                    double convert_blocks) {
  BwdTailSplit split;
  split.key_blocks = key_blocks;
  split.full_tiles = tiles;
  if (sms <= 0 || tiles <= sms || blocks_per_tile < 2) return split;
  const int tail = tiles % sms;
  if (tail == 0 || tail > max_split_tiles) return split;
  const double idle_blocks = double(sms - tail) * blocks_per_tile - convert_blocks;  // SM · blocks
  if (idle_blocks < 0.3 * sms * blocks_per_tile) return split;
  constexpr double kPartCostBlocks = 2.0;
  const double unsplit = blocks_per_tile;
  double best = unsplit;
  int best_parts = 1;
  const int max_parts = blocks_per_tile < kBwdMaxSplitParts ? blocks_per_tile : kBwdMaxSplitParts;
  for (int parts = 2; parts <= max_parts; ++parts) {
    const int rounds = (tail * parts + sms - 1) / sms;
    const double length = rounds * (double(blocks_per_tile) / parts + kPartCostBlocks);
    if (length < best) best = length, best_parts = parts;
  }
  if (best > 0.9 * unsplit) return split;
  split.full_tiles = tiles - tail;
  split.split_tiles = tail;
  split.parts = best_parts;
  return split;
}

}  // namespace flashcute
