// Merging attention states: outputs O_s of the same query rows over disjoint key sets, each with
// its LSE, combine into the output over all the keys,
//   lse = log Σ_s exp(lse_s),   O = Σ_s exp(lse_s - lse) · O_s.
// Split-KV decoding (split_kv.h) merges its splits with it; the public
// merge_attention_states (cascade inference, context parallelism) merges two outputs.
// A state with lse = -inf (or NaN) holds no key and adds nothing (its O is not read, so garbage
// there cannot poison the sum); rows empty in every state give zeros and -inf.
#pragma once

#include <cstdint>

namespace flashcute {

// One output, (batch, seqlen, heads, headdim) with these element strides, and its LSE
// (batch, heads, seqlen) with its own strides.
struct StateView {
  void* o;
  float* lse;  // may be null for the merged output
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride, lse_row_stride;
};

struct MergeStatesParams {
  // Inputs: `sources` views (1 or 2); a single source holds `states` states `o_state_stride` and
  // `lse_state_stride` elements apart (split-KV partials), two sources one state each.
  StateView source[2];
  int sources;
  int states;
  int64_t o_state_stride, lse_state_stride;
  StateView out;
  int batch, seqlen, heads, headdim;
};

}  // namespace flashcute
