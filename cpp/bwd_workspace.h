// Layout of the backward's workspace, shared by the size query, the API and the launchers.
//
//   row_dot   fp32 (batch, nheads, rows_padded)     every path
//   lse_log2  fp32 (batch, nheads, rows_padded)     Hopper path
//   dq_accum  fp32 (slots, rows_padded, headdim)    Hopper path
//
// The Hopper path adds dQ into dq_accum from every key block. To keep that buffer small for
// long sequences it covers a chunk of (batch, kv head) pairs at a time, the launcher running
// chunk after chunk; a chunk holds enough key-block CTAs to fill the GPU many times over.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace flashcute {

constexpr int64_t kBwdRowPadding = 128;       // rows per padded query block
constexpr int64_t kHopperBwdBlockN = 128;     // keys per Hopper-path dK/dV CTA (hd 256: fewer)
constexpr int64_t kHopperBwdChunkCtas = 4096;  // dK/dV CTAs per dq_accum chunk, at least

struct BwdWorkspace {
  int64_t rows_padded = 0;   // seqlen_q rounded up to kBwdRowPadding
  int64_t chunk_pairs = 0;   // (batch, kv head) pairs per dq_accum chunk (Hopper path)
  size_t row_dot_offset = 0, lse_log2_offset = 0, dq_accum_offset = 0;  // bytes
  size_t bytes = 0;
};

inline BwdWorkspace bwd_workspace(int64_t batch, int64_t nheads, int64_t nheads_kv, int64_t seqlen_q,
                                  int64_t seqlen_k, int64_t headdim, bool hopper) {
  BwdWorkspace w;
  w.rows_padded = (seqlen_q + kBwdRowPadding - 1) / kBwdRowPadding * kBwdRowPadding;
  const size_t row_bytes = static_cast<size_t>(batch * nheads * w.rows_padded) * sizeof(float);
  w.row_dot_offset = 0;
  w.bytes = row_bytes;
  if (!hopper || nheads_kv <= 0) return w;
  const int64_t pairs = batch * nheads_kv;
  const int64_t key_blocks = std::max<int64_t>(1, (seqlen_k + kHopperBwdBlockN - 1) / kHopperBwdBlockN);
  w.chunk_pairs = std::min(pairs, (kHopperBwdChunkCtas + key_blocks - 1) / key_blocks);
  w.lse_log2_offset = row_bytes;
  w.dq_accum_offset = 2 * row_bytes;
  const int64_t slots = w.chunk_pairs * (nheads / nheads_kv);
  w.bytes = 2 * row_bytes + static_cast<size_t>(slots * w.rows_padded * headdim) * sizeof(float);
  return w;
}

}  // namespace flashcute
