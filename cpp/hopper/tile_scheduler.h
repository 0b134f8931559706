// Persistent tile order of the Hopper-path forward. CTA i of a grid of G runs the work units
// i, i + G, i + 2G, ...; a unit is one query tile, or with causal masking a pair of tiles.
//
// Causal: query block m sees m + 1 key blocks (plus a constant when seqlen_k > seqlen_q), so
// the blocks m and M-1-m of one head together cost the same for every m. Units made of such
// pairs (longest tile first) have equal cost, and handing them out round-robin balances the
// CTAs up to the last partial round, with no atomic counter. When M is odd the middle block
// is a unit of its own; those half units come after all pairs and fill the tail. With packed
// queries of several lengths, M is the longest sequence's; each sequence pairs its own tiles
// in those units (seq_tile, fwd_params.h).
//
// Units are grouped by (batch, head) so that the CTAs running at once share few K/V heads
// (their K/V stays in L2; the group size is chosen at launch, fwd_launch.h); inside a group
// the order is query-block-major (pair-major). Without pairs, the last query block of every
// head (a partial tile) can be moved behind all other units, so short tiles fill the tail.
//
// Without causal masking the last wave's tiles may be shared by all CTAs instead
// (fwd_tail_split.h): after its whole units a CTA runs one or two pieces, each a range of one
// tile's key blocks.
//
// Variable-length batches claim their units instead: a unit's work follows its sequence's
// length, which the host does not know, and a fixed round-robin leaves some CTAs far more of it
// than others. CTA i starts with unit i and takes each next one from a zeroed counter (grid
// size + the counter's old value), so units still start in order (the CTAs running at once share
// a few heads' K/V in L2) but go to whichever CTA is free. So do windows with a left side, whose
// first query blocks see fewer keys: walked from the last unit (reversed), those light tiles
// fill the tail. The producer thread claims the units and hands each tile with rows to the
// consumers through a two-slot ring in shared memory (TileClaims).
#pragma once

#include <cute/config.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/fast_math.h>

#include "fwd_tail_split.h"

namespace flashcute::hopper {

struct FwdTile {
  int m_block;
  int head;
  int batch;
  int key_begin = 0;        // key blocks [key_begin, key_end) of the tile's range
  int key_end = 1 << 30;
  int split = -1;           // a piece: the split tile's index (its count), else -1
};

// The query tiles of one work unit: m_blocks[0], then m_blocks[1] when count == 2.
struct FwdUnit {
  int m_blocks[2];
  int count;
  int head;
  int batch;
  CUTE_HOST_DEVICE FwdTile tile(int part) const { return FwdTile{part == 0 ? m_blocks[0] : m_blocks[1], head, batch}; }
};

struct TileSchedule {
  int num_m_blocks;
  int nheads;
  int num_head_batch;  // nheads * batch
  int group_size;      // (batch, head) pairs per group
  int num_units;
  bool paired;         // causal: units are (M-1-p, p) pairs of query blocks
  bool last_block_last;  // not paired: every head's last query block after all the others
  FwdTailSplit split;    // not paired: units [split.whole_units, num_units) run as pieces
  int* claims;           // claimed order: the counter, zero at launch; null: round-robin
  bool reversed;         // claimed order: units from the last to the first
  // unit()'s divisors as multiplies (some walks decode a unit per tile): units per group, heads
  // per group (the last group: the heads left), heads.
  cutlass::FastDivmod by_group_units, by_group_heads, by_last_group_heads, by_nheads;

  CUTE_HOST_DEVICE static TileSchedule make(int num_m_blocks, int nheads, int batch, int group_size, bool paired,
                                            bool last_block_last = false) {
    TileSchedule s{};
    s.num_m_blocks = num_m_blocks;
    s.nheads = nheads;
    s.num_head_batch = nheads * batch;
    s.group_size = group_size;
    s.paired = paired;
    s.last_block_last = !paired && last_block_last;
    // Paired: floor(M/2) pairs per head, then one middle block per head when M is odd.
    s.num_units = paired ? s.num_head_batch * ((num_m_blocks + 1) / 2) : s.num_head_batch * num_m_blocks;
    s.split.whole_units = s.num_units;
    const int last_group_heads = s.num_head_batch - (s.num_head_batch - 1) / group_size * group_size;
    s.by_group_units = cutlass::FastDivmod(group_size * s.ranks() > 0 ? group_size * s.ranks() : 1);
    s.by_group_heads = cutlass::FastDivmod(group_size);
    s.by_last_group_heads = cutlass::FastDivmod(last_group_heads);
    s.by_nheads = cutlass::FastDivmod(nheads);
    return s;
  }

  // Units per head before the tail (paired: the middle blocks; else the last blocks, if asked).
  CUTE_HOST_DEVICE int ranks() const {
    return paired ? num_m_blocks / 2 : num_m_blocks - (last_block_last ? 1 : 0);
  }

  // unit(index).count, without decoding the unit: only pairs have two tiles, and the middle
  // blocks (M odd) come after all of them.
  CUTE_HOST_DEVICE int unit_tiles(int index) const {
    return paired && index < num_head_batch * (num_m_blocks / 2) ? 2 : 1;
  }

  CUTE_HOST_DEVICE FwdUnit unit(int index) const {
    const int grouped_units = num_head_batch * ranks();
    int rank, head_batch;
    if (index < grouped_units) {
      int group, in_group;
      by_group_units(group, in_group, index);
      const int first = group * group_size;
      const bool last_group = num_head_batch - first < group_size;
      int in_rank;
      (last_group ? by_last_group_heads : by_group_heads)(rank, in_rank, in_group);
      head_batch = first + in_rank;
    } else {  // the tail: the middle block (paired, M odd) or the last block of head `index - grouped_units`
      rank = ranks();
      head_batch = index - grouped_units;
    }
    FwdUnit u;
    by_nheads(u.batch, u.head, head_batch);
    if (!paired) {
      u.m_blocks[0] = u.m_blocks[1] = rank;
      u.count = 1;
    } else {
      u.m_blocks[0] = num_m_blocks - 1 - rank;
      u.m_blocks[1] = rank;
      u.count = u.m_blocks[0] == rank ? 1 : 2;
    }
    return u;
  }
};

// Shared memory of the claimed order: the tiles the producer runs, in turn, step s (its s-th
// tile with rows, the consumers' iteration s) in slot s % 2; `full` completes a phase when the
// producer has written a slot, `empty` when every other walking warp (consumers, V
// transposers) has moved on to the next step. Until then a reader reads its tile from the slot
// whenever it needs it rather than holding it in registers. A tile of batch -1 ends the walk.
// Tiles without rows are never handed on, so a reader's step is its own tile count.
struct TileClaims {
  int tile[2][3];     // m_block, head, batch
  int claimer_next;   // the claimer's next unit, claimed one unit ahead (its thread has few registers)
  cutlass::arch::ClusterBarrier full[2], empty[2];

  // By the claimer's thread.
  CUTE_DEVICE void init(int reader_warps) {
    for (int s = 0; s < 2; ++s) full[s].init(1), empty[s].init(reader_warps);
  }
  CUTE_DEVICE void publish(int step, int m_block, int head, int batch) {
    const int slot = step & 1;
    if (step >= 2) empty[slot].wait(((step >> 1) - 1) & 1);
    tile[slot][0] = m_block, tile[slot][1] = head, tile[slot][2] = batch;
    full[slot].arrive();  // release: the tile is written before the phase completes
  }
  // Every lane of a reading warp: waits for step `step`'s tile, after giving back the slot of
  // the step before.
  CUTE_DEVICE void receive(int step) {
    if (step > 0) {
      __syncwarp();
      if (threadIdx.x % 32 == 0) empty[(step - 1) & 1].arrive();
    }
    full[step & 1].wait((step >> 1) & 1);
  }
  // A received step's tile (every lane, until the warp receives the next step).
  CUTE_DEVICE FwdUnit read(int step) const {
    volatile const int* t = tile[step & 1];
    FwdUnit u;
    u.m_blocks[0] = u.m_blocks[1] = t[0];
    u.head = t[1], u.batch = t[2];
    u.count = 1;
    return u;
  }
};

// One CTA's tiles in order: units blockIdx.x, + gridDim.x, ... below split.whole_units, each
// unit's tiles in turn; then the pieces of its range of the split tiles' key blocks. The
// pieces' ranges are recomputed per piece (at most two).
// In the claimed order (kClaims, and schedule.claims set), the producer thread (kClaimer)
// claims units and hands on each tile it runs (publish); the other walking warps receive those
// tiles, step by step (advance's argument: the tiles they ran so far); no pieces. Kernels
// without it (kClaims false) compile the fixed order alone.
//
// A walk holds its unit (kHoldsUnit), decoded once per unit. Where a kernel has no registers to
// spare across a tile's key blocks (the two-consumer tiles: their consumers, and the
// producer thread), its walks decode the unit from its index once per tile instead (a few
// multiplies), or, reading a claimed order, read it again from the ring.
// Kernels whose calls never split tiles (kSplits false: 8-bit) compile neither the pieces nor
// their state: there the walk ends at the last whole unit.
template <bool kClaims, bool kClaimer = false, bool kHoldsUnit = true, bool kSplits = true>
struct TileWalk {
  static_assert(kSplits || !kClaims, "a walk without pieces runs the fixed order");
  TileSchedule const& schedule;
  TileClaims& claims;
  int unit_index;
  int part = 0;
  int piece = -1;  // -1 while whole units remain; then the piece (0 or 1)
  int pieces = 0;  // set when the whole units are done
  int held_step = 0;  // a reader, claimed order: the step whose slot it holds
  FwdUnit unit{};     // kHoldsUnit: the current unit

  CUTE_DEVICE TileWalk(TileSchedule const& schedule_, TileClaims& claims_)
      : schedule(schedule_), claims(claims_), unit_index(blockIdx.x) {
    if (claimed_order()) {
      if constexpr (kClaimer) {
        asm volatile("griddepcontrol.wait;" ::: "memory");  // the counter's zeroing
        take(blockIdx.x);
      } else {
        receive(0);
      }
    } else if (unit_index < schedule.split.whole_units) {
      hold_unit();
    } else if constexpr (kSplits) {
      start_pieces();
    }
  }
  CUTE_DEVICE bool claimed_order() const { return kClaims && schedule.claims != nullptr; }
  CUTE_DEVICE bool valid() const {
    if constexpr (!kSplits) return unit_index < schedule.split.whole_units;
    return piece < pieces;
  }
  CUTE_DEVICE FwdTile tile() const {
    if constexpr (!kSplits) return current_unit().tile(part);
    return piece < 0 ? current_unit().tile(part) : piece_tile(piece);
  }
  // Piece k (0 or 1) of this CTA's range of the split tiles' key blocks.
  CUTE_DEVICE FwdTile piece_tile(int k) const {
    FwdTailSplit const& split = schedule.split;
    const int range_begin = split.begin(blockIdx.x), range_end = split.begin(blockIdx.x + 1);
    const int t = range_begin / split.key_blocks + k;
    FwdTile tile = schedule.unit(split.whole_units + t).tile(0);
    const int tile_begin = t * split.key_blocks, tile_end = tile_begin + split.key_blocks;
    tile.key_begin = (range_begin > tile_begin ? range_begin : tile_begin) - tile_begin;
    tile.key_end = (range_end < tile_end ? range_end : tile_end) - tile_begin;
    tile.split = t;
    return tile;
  }
  // `step`: a reader's tiles run so far (the claimed order's next step).
  CUTE_DEVICE void advance(int step = 0) {
    if (kSplits && piece >= 0) {
      ++piece;
      return;
    }
    if (++part < unit_tiles()) return;
    part = 0;
    if (claimed_order()) {
      if constexpr (kClaimer) take(claims.claimer_next);
      else receive(step);
      return;
    }
    unit_index += grid_size();
    if (unit_index < schedule.split.whole_units) hold_unit();
    else if constexpr (kSplits) start_pieces();
  }
  CUTE_DEVICE FwdUnit current_unit() const {
    if constexpr (kHoldsUnit) return unit;
    if (!kClaimer && claimed_order()) return claims.read(held_step);
    return schedule.unit(schedule_index());
  }
  CUTE_DEVICE int unit_tiles() const {
    if constexpr (kHoldsUnit) return unit.count;
    if (!kClaimer && claimed_order()) return 1;
    return schedule.unit_tiles(schedule_index());
  }
  // The unit's index in the schedule (the claimed order may walk it from the last unit).
  CUTE_DEVICE int schedule_index() const {
    return claimed_order() && schedule.reversed ? schedule.num_units - 1 - unit_index : unit_index;
  }
  // gridDim.x, read where it is used: held from the kernel's start, the producer thread of the
  // two-consumer tiles spills it.
  CUTE_DEVICE static int grid_size() {
    int n;
    asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(n));
    return n;
  }
  // The claimer, claimed order: hands on the current tile as step `step`, or (valid() false)
  // the end. A no-op otherwise.
  CUTE_DEVICE void publish(int step) {
    static_assert(kClaimer);
    if (!claimed_order()) return;
    if (!valid()) {
      claims.publish(step, 0, 0, -1);
      return;
    }
    const FwdUnit current = current_unit();
    claims.publish(step, current.tile(part).m_block, current.head, current.batch);
  }

 private:
  // The claimer's next unit (past the units: the end), and the claim of the one after it.
  CUTE_DEVICE void take(int next) {
    if (next >= schedule.num_units) {
      piece = pieces = 0;  // the walk ends
      return;
    }
    unit_index = next;
    hold_unit();
    claims.claimer_next = atomicAdd(schedule.claims, 1) + int(gridDim.x);
  }
  CUTE_DEVICE void receive(int next_step) {
    claims.receive(next_step);
    held_step = next_step;
    const FwdUnit received = claims.read(held_step);
    if constexpr (kHoldsUnit) unit = received;
    if (received.batch < 0) piece = pieces = 0;  // the walk ends
  }
  CUTE_DEVICE void hold_unit() {
    if constexpr (kHoldsUnit) unit = schedule.unit(schedule_index());
  }

  // Counts the split tiles this CTA's range touches (its range is never longer than a tile).
  CUTE_DEVICE void start_pieces() {
    FwdTailSplit const& split = schedule.split;
    piece = 0;
    if (split.tiles == 0) return;
    const int range_begin = split.begin(blockIdx.x), range_end = split.begin(blockIdx.x + 1);
    if (range_end > range_begin)
      pieces = (range_end - 1) / split.key_blocks - range_begin / split.key_blocks + 1;
  }
};

}  // namespace flashcute::hopper
