// Host: how a KV-cache call runs on the Ampere-path forward: whether query heads are packed into
// rows (packed_rows.h) and over how many splits its key blocks go (split_kv.h). Plain C++: the
// workspace query and the call plan with the same function, so both always agree.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernel_params.h"
#include "split_kv.h"

namespace flashcute {

// The query heads per K/V head packed into a tile: G where packing holds, else 1. It needs a
// batched q (a packed one's tiles are its sequences'), no ALiBi (its slope and distance follow
// the query head and row that packing merges), no dropout, and a mask that treats every packed
// row alike: no band, or one query row and no left window side (the bottom-right diagonal and a
// right side then mask nothing); and it must save tiles.
inline int kvcache_packed_heads(const FwdKernelParams& p, int block_m) {
  const int group = p.heads_per_kv;
  if (group < 2 || block_m <= 0 || p.seqlen_q <= 0 || p.cu_seqlens_q != nullptr) return 1;
  if (p.alibi_slopes != nullptr || p.dropout_threshold != 0) return 1;
  if (has_band(p) && (p.seqlen_q != 1 || p.window_left < p.seqlen_k)) return 1;
  if (static_cast<long long>(p.seqlen_q) * group > INT_MAX - 256) return 1;
  const long long tiles = static_cast<long long>(group) * ((p.seqlen_q + block_m - 1) / block_m);
  const long long packed_tiles = (static_cast<long long>(p.seqlen_q) * group + block_m - 1) / block_m;
  return packed_tiles < tiles ? group : 1;
}

// The call as the kernel runs it with `packed` heads per K/V head (the same call for 1).
inline FwdKernelParams kvcache_packed_view(const FwdKernelParams& p, int packed) {
  FwdKernelParams view = p;
  view.packed_heads = packed;
  if (packed <= 1) return view;
  view.seqlen_q = p.seqlen_q * packed;
  view.nheads = p.nheads / packed;
  view.heads_per_kv = 1;
  view.causal = false;  // one query row or no band: nothing to mask but the keys' end
  view.window_left = view.seqlen_k;
  view.window_right = view.seqlen_q;
  return view;
}

// Splits for `tiles` query tiles of `key_blocks` key blocks each on `slots` = SMs · CTAs per SM.
// requested > 0 is taken as given (within the blocks and the grid); 0 asks for the heuristic:
// no split once the tiles fill 80% of a wave, else the fewest splits whose wave efficiency
// (work / (waves · slots)) is within 95% of the best over 1..128 splits, each split keeping at
// least 2 key blocks. Measured (benchmarks/results/, feature "decode").
inline int kvcache_splits(long long tiles, int key_blocks, int slots, int requested, int batch) {
  const int most = std::max(1, std::min({128, key_blocks, 65535 / std::max(batch, 1)}));
  if (requested > 0) return std::min(requested, most);
  if (tiles <= 0 || slots <= 0 || tiles * 5 >= static_cast<long long>(slots) * 4) return 1;
  const int candidates = std::max(1, std::min(most, key_blocks / 2));
  auto efficiency = [&](int s) {
    const long long work = tiles * s;
    const long long waves = (work + slots - 1) / slots;
    return static_cast<double>(work) / static_cast<double>(waves * slots);
  };
  double best = 0.0;
  for (int s = 1; s <= candidates; ++s) best = std::max(best, efficiency(s));
  for (int s = 1; s <= candidates; ++s)
    if (efficiency(s) >= 0.95 * best) return s;
  return 1;
}

}  // namespace flashcute
