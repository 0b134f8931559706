// The dK/dV kernel's last wave, split (Hopper path, without a causal or window band). Every dK/dV CTA
// of a non-causal call has the same work, so when the CTA count T is not a multiple of the
// SM count S, the last r = T mod S CTAs run alone while S - r SMs idle (2048 CTAs on 132 SMs:
// 68 of them). Those r tiles (the last ones in launch order) instead run as `parts` CTAs each,
// every part walking a contiguous share of the tile's query blocks; the parts add their fp32
// dK and dV into the workspace (dkv_accum), and the part that finishes last reads the sum
// back and stores dK and dV.
//
// Launch order is tile order, then the parts: tiles [0, full_tiles) one CTA each, then
// split_tiles tiles of `parts` CTAs. A tile is (pair of the chunk) · key_blocks + key block.
// Causal and windowed calls are never split; causal ones may end in key-block order (plan_causal_tail).
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
  // Causal calls (plan_causal_tail): the chunk's last tail_pairs pairs run key block by key
  // block, their pairs in turn within each; 0 keeps tile order.
  int tail_pairs = 0;
  int tail_from = 0;  // the first of them

  FLASHCUTE_HOST_DEVICE int ctas() const { return full_tiles + split_tiles * parts; }

  // The tile of unsplit CTA `cta`.
  FLASHCUTE_HOST_DEVICE int ordered_tile(int cta) const {
    const int tail_first_cta = tail_from * key_blocks;
    if (tail_pairs == 0 || cta < tail_first_cta) return cta;
    const int index = cta - tail_first_cta;
    return (tail_from + index % tail_pairs) * key_blocks + index / tail_pairs;
  }

  // The tile, its part and its split tile index (-1: not split) of CTA `cta`.
  struct Work {
    int tile, part, split;
  };
  FLASHCUTE_HOST_DEVICE Work work(int cta) const {
    if (cta < full_tiles) return Work{ordered_tile(cta), 0, -1};
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

// Host: the order of a causal chunk of `pairs` pairs (never split). A causal dK/dV CTA's work
// falls with its key block (key block 0 meets the most query rows) and CTAs start in launch
// order, so in tile order the last pairs' long first key blocks start in the last wave and run
// on while other SMs idle. Their last ~two waves of CTAs go key block by key block instead, so
// the kernel ends on its shortest CTAs. Only the tail: the whole grid in such groups measured
// 1-4 % slower at hd 64 and at 1k. The tail's pairs are read at once (Q, dO and the dQ
// accumulator of each: pair_bytes), so they stay within a part of L2. Measured on the H200
// (hd 128 and 256, 2k-8k): 2-4 % less time; hd 64 and 1k (under 16 key blocks): no change.
inline void plan_causal_tail(BwdTailSplit& split, int pairs, int sms, long long pair_bytes) {
  constexpr int kMinKeyBlocks = 16;
  constexpr long long kTailBytes = 24ll << 20;
  if (split.split_tiles > 0 || pairs < 2 || split.key_blocks < kMinKeyBlocks) return;
  long long tail = (2ll * sms + split.key_blocks - 1) / split.key_blocks;
  if (pair_bytes > 0 && tail * pair_bytes > kTailBytes) tail = kTailBytes / pair_bytes;
  if (tail < 2) return;
  split.tail_pairs = static_cast<int>(tail < pairs ? tail : pairs);
  split.tail_from = pairs - split.tail_pairs;
}

}  // namespace flashcute
