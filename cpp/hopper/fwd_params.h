// Kernel arguments of the Hopper-path forward: the shared launch arguments plus the TMA
// descriptors (built on the host, read from the __grid_constant__ parameter space), the
// persistent tile schedule and the workspace of a split last wave.
#pragma once

#include "hopper/fwd_traits.h"
#include "hopper/tile_scheduler.h"
#include "kernel_params.h"

namespace flashcute::hopper {

template <class Traits>
struct FwdParams {
  FwdKernelParams args;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  typename Traits::TmaO tma_o;
  TileSchedule schedule;
  int tma_seqlen_k;  // seqlen_k, or 1 when there are no keys (a TMA dimension cannot be 0)
  // Causal: query tiles start this many rows (whole 64-row consumer blocks) before row 0, so a
  // partial tile is the first, the one that sees the fewest keys, not the last (tile_row0).
  int row_shift;
  int nheads_kv;
  // The split tiles' counts and pieces' states (fwd_tail_split.h); null without a split.
  int* split_count;
  float* split_state;
};

// First query row of tile m_block; negative for a shifted first tile. Its 64-row blocks before
// row 0 are neither loaded, computed nor stored.
template <class Traits>
CUTE_HOST_DEVICE int tile_row0(FwdParams<Traits> const& params, int m_block) {
  return m_block * Traits::kBlockM - params.row_shift;
}

}  // namespace flashcute::hopper
