// Host: whether a Hopper-path forward splits its last wave (fwd_tail_split.h), and the
// workspace that needs. Plain C++: the host API sizes the workspace with it, the launcher
// plans its grid with it, so both always agree.
#pragma once

#include <climits>
#include <cstddef>

#include "fwd_tail_split.h"
#include "hopper/fwd_config.h"
#include "hopper/fwd_packed_heads.h"
#include "kernel_params.h"

namespace flashcute::hopper {

struct FwdSplitPlan {
  FwdTailSplit split;
  FwdSplitWorkspace workspace;
};

// Only without a causal or window band (every tile has the same work), with keys to split and
// in a fixed-length batch (a variable-length one's tiles differ per sequence).
// The plan is the packed call's (fwd_packed_heads.h) where query heads are packed. `headdim`:
// the kernel's, which sets the tile; `headdim_v` (0: headdim), its V head dim, sets the
// pieces' state (the call's may be smaller).
inline FwdSplitPlan plan_fwd_split(const FwdKernelParams& call, int headdim, int sms, int headdim_v = 0) {
  if (headdim_v == 0) headdim_v = headdim;
  FwdSplitPlan plan;
  const FwdTileSize tile =
      fwd_tile_size(headdim, fwd_second_tile(headdim, call.seqlen_q, call.seqlen_k, call.causal));
  const int block_m = 64 * tile.consumers;
  const FwdKernelParams p = fwd_packed_view(call, fwd_packed_heads(call, headdim, block_m, headdim_v));
  if (tile.consumers == 0 || has_band(p) || fwd_varlen(p) || p.seqlen_q <= 0 || p.seqlen_k <= 0 || p.batch <= 0 || p.nheads <= 0)
    return plan;
  const long long units = static_cast<long long>((p.seqlen_q + block_m - 1) / block_m) * p.nheads * p.batch;
  if (units > INT_MAX) return plan;
  const int key_blocks = (p.seqlen_k + tile.block_n - 1) / tile.block_n;
  const bool few_rows = fwd_split_few_rows(p.seqlen_q < block_m ? p.seqlen_q : block_m, headdim_v, tile.consumers);
  plan.split = plan_fwd_tail_split(static_cast<int>(units), key_blocks, sms, p.seqlen_q % block_m != 0, few_rows);
  plan.workspace = fwd_split_workspace(plan.split, tile.consumers, headdim_v);
  return plan;
}

// 16-bit calls whose tiles differ in work claim them through a counter (tile_scheduler.h) in the
// workspace: variable-length batches, and windows with a left side over more than two waves of
// tiles (their first query blocks see fewer keys). kFwdClaimBytes: the bytes it takes.
constexpr size_t kFwdClaimBytes = 16;
inline bool fwd_windowed(const FwdKernelParams& p) { return p.window_left < p.seqlen_k; }
inline bool fwd_claims_tiles(const FwdKernelParams& p) {
  return (fwd_varlen(p) || fwd_windowed(p)) && p.tile_claims != nullptr;
}
// The workspace bytes a 16-bit call asks for its claims on `sms` SMs; `headdim`, the kernel's.
inline size_t fwd_claim_bytes(const FwdKernelParams& p, int headdim, int sms) {
  if (fwd_varlen(p)) return kFwdClaimBytes;
  if (!fwd_windowed(p) || p.seqlen_q <= 0 || p.nheads <= 0 || p.batch <= 0) return 0;
  const FwdTileSize tile = fwd_tile_size(headdim, fwd_second_tile(headdim, p.seqlen_q, p.seqlen_k, p.causal));
  if (tile.consumers == 0) return 0;
  const int block_m = 64 * tile.consumers;
  const long long units = static_cast<long long>((p.seqlen_q + block_m - 1) / block_m) * p.nheads * p.batch;
  return units > 2ll * sms ? kFwdClaimBytes : 0;
}

}  // namespace flashcute::hopper
