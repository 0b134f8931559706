// The end of a piece of a split tile (fwd_tail_split.h): every piece leaves its consumers'
// state in the workspace and the CTA counts the piece done; the CTA that counts last merges all
// pieces' states and stores the tile through the usual epilogue, after its own pieces.
//
// A state is what the online softmax holds after the piece's last key block: the unnormalized
// O accumulator, the row maxima (raw scores, as OnlineSoftmax keeps them) and this thread's
// part of the row sums. Thread t of a consumer writes it in register order, 16 bytes at
// `base + chunk · 512 + t · 4` floats, so a warpgroup's instruction covers 2 KB contiguous and
// the merging thread with the same t reads exactly its own rows and columns back.
#pragma once

#include <cute/tensor.hpp>

#include "dq_reduce.h"
#include "hopper/fwd_params.h"
#include "hopper/named_barriers.h"
#include "online_softmax.h"

namespace flashcute::hopper {

// Where this thread's state of a piece lies: kRows x kCols accumulator values, then one chunk
// of 2 row maxima and 2 row sums.
template <class Traits, int kRows, int kCols>
struct PieceStates {
  static_assert(kRows == 2, "the state's last 16 bytes hold 2 row maxima and 2 row sums");
  static_assert(kCols % 4 == 0);
  static constexpr int kAccChunks = kRows * kCols / 4;
  static constexpr int kStateFloats = (kAccChunks + 1) * 512;  // per consumer and slot
  static_assert(kStateFloats == fwd_split_state_floats(Traits::kHeadDim), "the workspace the host sizes");
  FwdTailSplit const& split;
  float* base;  // this consumer's and thread's part of slot 0

  CUTE_DEVICE PieceStates(FwdParams<Traits> const& params, int consumer)
      : split(params.schedule.split),
        base(params.split_state + consumer * kStateFloats + (threadIdx.x % 128) * 4) {}
  // CTA `cta`'s piece of split tile `tile`.
  CUTE_DEVICE float* of(int cta, int tile) const {
    return base + static_cast<size_t>(split.slot(cta, tile)) * Traits::kConsumers * kStateFloats;
  }
  CUTE_DEVICE static float* chunk(float* state, int r, int c) { return state + (r * kCols + c) / 4 * 512; }
  CUTE_DEVICE static float* rows(float* state) { return state + kAccChunks * 512; }
};

// A piece's end, in every consumer thread after its last P·V has completed: its state goes to
// the workspace and the CTA counts the piece done. storage.split_last[piece] then says whether
// this CTA counted last, so that it merges and stores the tile (merge_split_pieces) once its
// pieces are done: the merge stays out of the tile loop, whose registers it would crowd.
template <class Traits, class AccRc, int kRows>
CUTE_DEVICE void leave_split_piece(FwdParams<Traits> const& params, typename Traits::SharedStorage& storage,
                                   int consumer, FwdTile const& tile, int piece, AccRc const& acc_rc,
                                   OnlineSoftmax<kRows> const& softmax) {
  constexpr int kCols = decltype(cute::size<1>(acc_rc))::value;
  using States = PieceStates<Traits, kRows, kCols>;
  float* own = States(params, consumer).of(blockIdx.x, tile.split);
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < kCols; c += 4) {
      __stcg(reinterpret_cast<float4*>(States::chunk(own, r, c)),
             make_float4(acc_rc(r, c), acc_rc(r, c + 1), acc_rc(r, c + 2), acc_rc(r, c + 3)));
    }
  }
  __stcg(reinterpret_cast<float4*>(States::rows(own)),
         make_float4(softmax.row_max[0], softmax.row_max[1], softmax.row_sum[0], softmax.row_sum[1]));
  // The barrier orders every thread's stores before thread 0's release (count_arrive), which
  // the counting CTA that reads them acquires.
  named_barrier_sync(int(FwdBarrier::kSplitCount), 128 * Traits::kConsumers);
  if (consumer == 0 && threadIdx.x % 128 == 0) {
    FwdTailSplit const& split = params.schedule.split;
    storage.split_last[piece] = count_arrive(params.split_count + tile.split) == split.parts(tile.split) - 1;
  }
  named_barrier_sync(int(FwdBarrier::kSplitCount), 128 * Traits::kConsumers);
}

// The tile of a piece that counted last: every piece's state is read back (this CTA's own
// included) and merged into acc_rc and softmax, ready for finalize() and the epilogue.
template <class Traits, class AccRc, int kRows>
CUTE_DEVICE void merge_split_pieces(FwdParams<Traits> const& params, int consumer, FwdTile const& tile,
                                    AccRc& acc_rc, OnlineSoftmax<kRows>& softmax) {
  constexpr int kCols = decltype(cute::size<1>(acc_rc))::value;
  using States = PieceStates<Traits, kRows, kCols>;
  const States states(params, consumer);
  FwdTailSplit const& split = params.schedule.split;
  // Accumulator columns rebuilt at once: the largest of 32, 16, 8, 4 that divides a row's.
  constexpr int kGroupCols = kCols % 32 == 0 ? 32 : kCols % 16 == 0 ? 16 : kCols % 8 == 0 ? 8 : 4;
  static_assert(kCols % kGroupCols == 0);
  auto state_of = [&](int cta) { return states.of(cta, tile.split); };
  const float scale_log2 = softmax.scale_log2;
  const int first = split.first_cta(tile.split), last = split.last_cta(tile.split);
  auto rows_of = [&](int cta) { return __ldcg(reinterpret_cast<const float4*>(States::rows(state_of(cta)))); };
  // One pass over the pieces for the row maxima and the sums rescaled to them (online, as
  // over key blocks). The loops over pieces stay rolled: unrolled, they let more loads fly but
  // cost the tile loop uniform registers (its WGMMA descriptors get rebuilt per instruction).
  float row_max[kRows] = {-INFINITY, -INFINITY};
  float row_sum[kRows] = {0.f, 0.f};
  auto max_scaled_of = [&](float m) { return m == -INFINITY ? 0.f : m * scale_log2; };
#pragma unroll 1
  for (int cta = first; cta <= last; ++cta) {
    const float4 rows = rows_of(cta);
    const float piece_max[kRows] = {rows.x, rows.y}, piece_sum[kRows] = {rows.z, rows.w};
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float new_max = fmaxf(row_max[r], piece_max[r]);
      // A row that saw no key so far keeps max -inf: subtract 0 so the factors are 0.
      const float new_scaled = max_scaled_of(new_max);
      row_sum[r] = row_sum[r] * fast_exp2(row_max[r] * scale_log2 - new_scaled) +
                   piece_sum[r] * fast_exp2(piece_max[r] * scale_log2 - new_scaled);
      row_max[r] = new_max;
    }
  }
  float max_scaled[kRows];
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) max_scaled[r] = max_scaled_of(row_max[r]);
  auto piece_scale = [&](float4 rows, int r) {
    return fast_exp2((r == 0 ? rows.x : rows.y) * scale_log2 - max_scaled[r]);
  };
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) softmax.row_max[r] = row_max[r], softmax.row_sum[r] = row_sum[r];

  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c0 = 0; c0 < kCols; c0 += kGroupCols) {
      CUTE_UNROLL
      for (int c = c0; c < c0 + kGroupCols; ++c) acc_rc(r, c) = 0.f;
#pragma unroll 1
      for (int cta = first; cta <= last; ++cta) {
        float* state = state_of(cta);
        const float scale = piece_scale(rows_of(cta), r);
        CUTE_UNROLL
        for (int c = c0; c < c0 + kGroupCols; c += 4) {
          const float4 v = __ldcg(reinterpret_cast<const float4*>(States::chunk(state, r, c)));
          acc_rc(r, c) = fmaf(v.x, scale, acc_rc(r, c));
          acc_rc(r, c + 1) = fmaf(v.y, scale, acc_rc(r, c + 1));
          acc_rc(r, c + 2) = fmaf(v.z, scale, acc_rc(r, c + 2));
          acc_rc(r, c + 3) = fmaf(v.w, scale, acc_rc(r, c + 3));
        }
      }
    }
  }
}

}  // namespace flashcute::hopper
