// Layout of the backward's workspace, shared by the size query, the API and the launchers.
//
//   row_dot   fp32 (batch, nheads, rows_padded)     every path
//   lse_log2  fp32 (batch, nheads, rows_padded)     Hopper path
//   dq_ready  int32 (chunk pairs)                    Hopper path: per (batch, kv head) pair, the
//                                                    dK/dV CTAs done adding dQ (16-byte padded)
//   dq_accum  fp32 (slots, rows_padded, headdim)    Hopper path; Ampere path unless deterministic
//   split_done int32 (split tiles)                   Hopper path without a causal or window band: the last
//   dkv_accum fp32 (split tiles, 2, 128, headdim)    wave's split tiles (bwd_tail_split.h): parts
//                                                    done, dK and dV sums (up to 128 keys a tile)
//
// Where dQ is added into dq_accum from every key block, that buffer covers a chunk of
// (batch, kv head) pairs at a time to stay small for long sequences, the launcher running
// chunk after chunk; a chunk holds enough key-block CTAs to fill the GPU many times over.
// A slot is one query head of the chunk: slot = (pair - first pair) · heads_per_kv + head in
// the group.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "bwd_tail_split.h"

namespace flashcute {

constexpr int64_t kBwdRowPadding = 128;        // rows per padded query block
constexpr int64_t kBwdChunkBlockN = 128;       // keys per dK/dV CTA the chunk size assumes (some use fewer)
constexpr int64_t kBwdChunkCtas = 4096;        // dK/dV CTAs per dq_accum chunk, at least
constexpr int64_t kBwdMaxChunkSlots = 65535;   // a chunk's slots (and pairs) are one grid dimension

struct BwdWorkspace {
  int64_t rows_padded = 0;   // seqlen_q rounded up to kBwdRowPadding
  int64_t chunk_pairs = 0;   // (batch, kv head) pairs per dq_accum chunk (0: no dq_accum)
  size_t row_dot_offset = 0, lse_log2_offset = 0, dq_ready_offset = 0, dq_accum_offset = 0;  // bytes
  size_t dq_ready_bytes = 0;  // right before dq_accum, so one memset clears both
  size_t split_done_offset = 0, dkv_accum_offset = 0;  // bytes; split_done right before dkv_accum
  int64_t split_tiles = 0;  // tiles of the last wave split_done and dkv_accum have room for
  size_t bytes = 0;
  bool has_lse_log2 = false, has_dq_accum = false, has_dq_ready = false;
};

// Whether the Hopper-path backward may split its last wave (bwd_tail_split.h): without a causal
// or window band (kernel_params.h, has_band), where every CTA has the same work.
inline bool hopper_bwd_tail_split(bool band) { return !band; }

// Bytes of one split tile's dK and dV sums (at most kBwdChunkBlockN keys).
inline size_t dkv_accum_tile_bytes(int64_t headdim) {
  return static_cast<size_t>(2 * kBwdChunkBlockN * headdim) * sizeof(float);
}

inline BwdWorkspace bwd_workspace(int64_t batch, int64_t nheads, int64_t nheads_kv, int64_t seqlen_q,
                                  int64_t seqlen_k, int64_t headdim, bool lse_log2, bool dq_accum,
                                  bool dq_ready = false, bool tail_split = false) {
  BwdWorkspace w;
  w.rows_padded = (seqlen_q + kBwdRowPadding - 1) / kBwdRowPadding * kBwdRowPadding;
  const size_t row_bytes = static_cast<size_t>(batch * nheads * w.rows_padded) * sizeof(float);
  w.row_dot_offset = 0;
  w.bytes = row_bytes;
  if (nheads_kv <= 0) return w;
  if (lse_log2) {
    w.has_lse_log2 = true;
    w.lse_log2_offset = w.bytes;
    w.bytes += row_bytes;
  }
  if (dq_accum) {
    const int64_t pairs = batch * nheads_kv;
    const int64_t key_blocks = std::max<int64_t>(1, (seqlen_k + kBwdChunkBlockN - 1) / kBwdChunkBlockN);
    const int64_t heads_per_kv = std::max<int64_t>(1, nheads / nheads_kv);
    w.chunk_pairs = std::min({pairs, (kBwdChunkCtas + key_blocks - 1) / key_blocks,
                              std::max<int64_t>(1, kBwdMaxChunkSlots / heads_per_kv)});
    const int64_t slots = w.chunk_pairs * (nheads / nheads_kv);
    if (dq_ready) {
      w.has_dq_ready = true;
      w.dq_ready_offset = w.bytes;
      w.dq_ready_bytes = (static_cast<size_t>(w.chunk_pairs) * sizeof(int32_t) + 15) / 16 * 16;
      w.bytes += w.dq_ready_bytes;
    }
    w.has_dq_accum = true;
    w.dq_accum_offset = w.bytes;
    w.bytes += static_cast<size_t>(slots * w.rows_padded * headdim) * sizeof(float);
    // Room for the split tiles of a chunk's last wave: fewer than the SM count, and at most an
    // eighth of the chunk's CTAs, which keeps it a fraction of dq_accum's size.
    const int64_t tiles = w.chunk_pairs * key_blocks;
    if (tail_split && dq_ready && tiles / 8 > 0) {
      w.split_tiles = std::min<int64_t>(kBwdMaxSplitTiles, tiles / 8);
      w.split_done_offset = w.bytes;
      w.bytes += (static_cast<size_t>(w.split_tiles) * sizeof(int32_t) + 15) / 16 * 16;
      w.dkv_accum_offset = w.bytes;
      w.bytes += static_cast<size_t>(w.split_tiles) * dkv_accum_tile_bytes(headdim);
    }
  }
  return w;
}

}  // namespace flashcute
