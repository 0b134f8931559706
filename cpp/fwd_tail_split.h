// The Hopper-path forward's last wave, shared by every CTA (without a causal or window band). Every
// query tile of a non-causal call has the same work, so with U tiles on S SMs the last
// r = U mod S tiles run alone while S - r SMs idle (hd 128, 2048 tiles on 132 SMs: 68 of
// them, for the whole length of a tile). With fewer tiles than SMs (small batch and few
// heads, long keys) most SMs never get one.
//
// Split: tiles [0, whole_units) run whole, round-robin as before; the key blocks of the
// other r tiles, laid end to end, are cut into S contiguous ranges, one per CTA. A range
// touches at most two tiles (it is shorter than a tile), so a CTA runs at most two pieces:
// the end of one tile and the start of the next. Every piece leaves its unnormalized output,
// row maxima and row sums (fp32) in the workspace and counts itself; the CTA whose piece counts
// last merges every piece of the tile, after its own pieces, and stores O and LSE.
#pragma once

#include <cstddef>

#include "host_device.h"  // plain C++ as well: the host API sizes the workspace from it

namespace flashcute {

struct FwdTailSplit {
  int whole_units = 0;  // schedule units that run whole
  int tiles = 0;        // the tiles after them, shared by all CTAs (0: no split)
  int key_blocks = 1;   // per tile
  int ctas = 1;         // the grid

  // 32-bit arithmetic throughout: the plan keeps blocks() · (ctas + 1) below 2^31 (the TMA
  // producer runs on 24 registers, where 64-bit divisions spill).
  FLASHCUTE_HOST_DEVICE int blocks() const { return tiles * key_blocks; }
  // First block (of the tiles' blocks end to end) of CTA `cta`'s range; begin(ctas) = blocks().
  FLASHCUTE_HOST_DEVICE int begin(int cta) const { return cta * blocks() / ctas; }
  // The CTA whose range holds block `block`: the last one with begin(cta) <= block.
  FLASHCUTE_HOST_DEVICE int cta_of(int block) const { return ((block + 1) * ctas + blocks() - 1) / blocks() - 1; }
  FLASHCUTE_HOST_DEVICE int first_cta(int tile) const { return cta_of(tile * key_blocks); }
  FLASHCUTE_HOST_DEVICE int last_cta(int tile) const { return cta_of((tile + 1) * key_blocks - 1); }
  // A tile's pieces: one per CTA whose range touches it.
  FLASHCUTE_HOST_DEVICE int parts(int tile) const { return last_cta(tile) - first_cta(tile) + 1; }
  // Where CTA `cta` leaves its piece of `tile`: slot 2·cta for the tile its range starts in,
  // 2·cta + 1 for the next one.
  FLASHCUTE_HOST_DEVICE int slot(int cta, int tile) const {
    return 2 * cta + (begin(cta) / key_blocks == tile ? 0 : 1);
  }
};

// Whether a split tile of `rows` query rows merges its pieces by chunks (fwd_split_pieces.h):
// every consumer thread takes at most two 16-byte chunks of the rows' values and loads a batch
// of pieces per L2 round trip, instead of one round trip per piece for its whole accumulator.
FLASHCUTE_HOST_DEVICE constexpr bool fwd_split_few_rows(int rows, int headdim, int consumers) {
  return rows * (headdim / 4) <= 2 * 128 * consumers;
}

// Host: the split for `units` tiles of `key_blocks` key blocks each on `sms` SMs. A piece costs
// about kPieceCostBlocks key blocks beyond its own (its Q load and first GEMM, its state
// written, counted, and read back by the last piece, whose merge waits on a few L2 round trips),
// and a CTA runs up to two. Every CTA gets two blocks or more: with fewer tiles than SMs and
// fewer than two blocks per SM, the grid shrinks to one CTA per two blocks (still more CTAs
// than tiles, so a range stays shorter than a tile). With fewer tiles than SMs a tile also
// gets at most ceil(sqrt(key blocks)) pieces, since its merge reads them one after another
// (H200, 1 x 100 queries x 20000 keys x 2 heads at hd 128: 22 CTAs, 38 us; 114 CTAs, 60 us),
// or, where its few rows merge in batches of pieces (few_rows), up to half the SMs' worth.
// Split only where the last wave gets shorter by a fifth of a tile: on H200 smaller savings
// measured as losses (hd 256 at 2k and 4k, +4 % and +1 %), since the SMs a short tail leaves
// idle let the busy ones clock higher under the power cap. With more tiles than SMs, not when
// some tiles are partial (they run last and cost less than the model's full tile).
inline FwdTailSplit plan_fwd_tail_split(int units, int key_blocks, int sms, bool partial_tiles = false,
                                        bool few_rows = false) {
  FwdTailSplit split;
  split.whole_units = units;
  split.key_blocks = key_blocks > 0 ? key_blocks : 1;
  split.ctas = units < sms ? units : sms;
  if (sms <= 0 || units <= 0 || key_blocks <= 0) return split;
  if (units >= sms && partial_tiles) return split;
  const int tail = units % sms;  // all of them when units < sms
  if (tail == 0) return split;
  const long long blocks = static_cast<long long>(tail) * key_blocks;
  int ctas = sms;
  if (blocks < 2ll * sms) {
    if (units >= sms) return split;  // the whole units go round-robin over all SMs
    ctas = static_cast<int>(blocks / 2);
    if (ctas <= units) return split;
  }
  if (units < sms) {
    // The CTA that counts a tile last merges its pieces one after another: P pieces of a tile
    // of K blocks cost about K / P + P block times, least at P = sqrt(K).
    int pieces = 1;
    while (pieces * pieces < key_blocks) ++pieces;
    // Few rows merge by chunks, a batch of pieces per L2 round trip: there, more pieces pay until
    // the tiles' pieces fill half the SMs (H200, 1 x 1 query x 30000 keys x 8 heads, GQA 4:1, hd
    // 128: 2 tiles, 28 CTAs 30.4 us, 58-74 CTAs 23.9-24.4 us, 106-132 CTAs 25.5-28.0 us).
    if (few_rows) {
      const int half_sms_per_tile = (sms / 2 + units - 1) / units;
      const int most = key_blocks / 2 > 1 ? key_blocks / 2 : 1;  // two blocks or more per piece
      if (pieces < half_sms_per_tile) pieces = half_sms_per_tile < most ? half_sms_per_tile : most;
    }
    if (static_cast<long long>(pieces) * units < ctas) ctas = pieces * units;
    if (ctas <= units) return split;
  }
  if (blocks * (ctas + 1) >= (1ll << 31)) return split;
  constexpr double kPieceCostBlocks = 3.0;
  const double per_cta = static_cast<double>((blocks + ctas - 1) / ctas) + 2 * kPieceCostBlocks;
  if (key_blocks - per_cta < 0.2 * key_blocks) return split;
  split.whole_units = units - tail;
  split.tiles = tail;
  split.ctas = ctas;
  return split;
}

// Floats of one consumer warpgroup's state in one slot (hopper/fwd_split_pieces.h lays it
// out): per thread, 64 rows x headdim accumulator values over 128 threads, then 2 row maxima
// and 2 row sums.
FLASHCUTE_HOST_DEVICE constexpr int fwd_split_state_floats(int headdim) { return (headdim / 2 + 4) * 128; }

// The forward's workspace where the last wave is split: one int32 count per split tile
// (zeroed by the launcher), then per slot (two per CTA) and consumer warpgroup its state.
struct FwdSplitWorkspace {
  size_t count_bytes = 0;  // 16-byte multiple; the states follow
  size_t state_floats_per_consumer = 0;
  size_t bytes = 0;
};

inline FwdSplitWorkspace fwd_split_workspace(const FwdTailSplit& split, int consumers, int headdim) {
  FwdSplitWorkspace w;
  if (split.tiles == 0) return w;
  w.count_bytes = (static_cast<size_t>(split.tiles) * 4 + 15) / 16 * 16;
  w.state_floats_per_consumer = static_cast<size_t>(fwd_split_state_floats(headdim));
  w.bytes = w.count_bytes + 2 * static_cast<size_t>(split.ctas) * consumers * w.state_floats_per_consumer * 4;
  return w;
}

}  // namespace flashcute
