// The end of a piece of a split tile (fwd_tail_split.h): every piece leaves its consumers'
// state in the workspace and the CTA counts the piece done; the CTA that counts last merges all
// pieces' states and stores the tile through the usual epilogue, after its own pieces.
//
// A state is what the online softmax holds after the piece's last key block: the unnormalized
// O accumulator, the row maxima (raw scores, as OnlineSoftmax keeps them) and this thread's
// part of the row sums. Thread t of a consumer writes it in register order, 16 bytes at
// `base + chunk · 512 + t · 4` floats, so a warpgroup's instruction covers 2 KB contiguous and
// the merging thread with the same t reads exactly its own rows and columns back.
//
// A tile with few query rows (fwd_split_few_rows: decoding) is merged by chunks instead: every
// consumer thread of the merging CTA takes one or two 16-byte chunks of the rows' values, so
// the pieces' loads are spread over all threads with many in flight, and writes O and LSE
// itself. Its pieces leave whole row sums (the quad's parts added) for that.
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
  static_assert(kStateFloats == fwd_split_state_floats(Traits::kHeadDimV), "the workspace the host sizes");
  FwdTailSplit const& split;
  float* base;  // this consumer's and thread's part of slot 0

  CUTE_DEVICE PieceStates(FwdParams<Traits> const& params, int consumer, int thread = threadIdx.x % 128)
      : split(params.schedule.split), base(params.split_state + consumer * kStateFloats + thread * 4) {}
  // CTA `cta`'s piece of split tile `tile`.
  CUTE_DEVICE float* of(int cta, int tile) const {
    return base + static_cast<size_t>(split.slot(cta, tile)) * Traits::kConsumers * kStateFloats;
  }
  CUTE_DEVICE static int chunk_offset(int r, int c) { return (r * kCols + c) / 4 * 512; }
  static constexpr int kRowsOffset = kAccChunks * 512;
  CUTE_DEVICE static float* chunk(float* state, int r, int c) { return state + chunk_offset(r, c); }
  CUTE_DEVICE static float* rows(float* state) { return state + kRowsOffset; }
};

// A piece's end, in every consumer thread after its last P·V has completed: its state goes to
// the workspace (none from a warp without query rows: a short seqlen_q) and the CTA counts
// the piece done. Returns, in every consumer thread, whether this CTA counted last, so that it
// merges and stores the tile (merge_split_pieces) once its pieces are done: the merge stays out
// of the tile loop, whose registers it would crowd.
template <class Traits, class AccRc, int kRows>
CUTE_DEVICE bool leave_split_piece(FwdParams<Traits> const& params, int consumer, FwdTile const& tile,
                                   AccRc const& acc_rc, OnlineSoftmax<kRows> const& softmax, bool has_rows,
                                   bool few_rows) {
  constexpr int kCols = decltype(cute::size<1>(acc_rc))::value;
  using States = PieceStates<Traits, kRows, kCols>;
  if (has_rows) {  // a warp whose rows all lie outside [0, seqlen_q) leaves nothing
    float* own = States(params, consumer).of(blockIdx.x, tile.split);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < kCols; c += 4) {
        __stcg(reinterpret_cast<float4*>(States::chunk(own, r, c)),
               make_float4(acc_rc(r, c), acc_rc(r, c + 1), acc_rc(r, c + 2), acc_rc(r, c + 3)));
      }
    }
    float row_sum[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) row_sum[r] = few_rows ? quad_allreduce_sum(softmax.row_sum[r]) : softmax.row_sum[r];
    __stcg(reinterpret_cast<float4*>(States::rows(own)),
           make_float4(softmax.row_max[0], softmax.row_max[1], row_sum[0], row_sum[1]));
  }
  // The barrier orders every thread's stores before thread 0's release (count_arrive), which
  // the counting CTA that reads them acquires.
  named_barrier_sync(int(FwdBarrier::kSplitCount), 128 * Traits::kConsumers);
  bool counted_last = false;
  if (consumer == 0 && threadIdx.x % 128 == 0) {
    FwdTailSplit const& split = params.schedule.split;
    // Under CUDA-graph capture the counts are zeroed by the grid this one follows as its
    // programmatic dependent (fwd_zero_counts): wait for it. A no-op otherwise.
    asm volatile("griddepcontrol.wait;" ::: "memory");
    counted_last = count_arrive(params.split_count + tile.split) == split.parts(tile.split) - 1;
  }
  // Thread 0's answer to every consumer thread, in registers.
  return any_of_threads(counted_last, int(FwdBarrier::kSplitCount), 128 * Traits::kConsumers);
}

// The tile of a piece that counted last: every piece's state is read back (this CTA's own
// included) and merged into acc_rc and softmax, ready for finalize() and the epilogue.
//
// Online over the pieces, as over key blocks: a piece's row maxima are loaded together with
// its accumulator values, so a piece costs one L2 round trip per group of values: one group
// up to 64 values per thread, two at hd 192 and 256 (128 values in flight beside the
// accumulator spill, so each group has its own loop over the pieces). Every group walks the
// pieces in the same order with the same maxima, so the groups agree. The loops over pieces
// stay rolled: unrolled, they cost the tile loop uniform registers (its WGMMA descriptors get
// rebuilt per instruction).
template <class Traits, class AccRc, int kRows>
CUTE_DEVICE void merge_split_pieces(FwdParams<Traits> const& params, int consumer, FwdTile const& tile,
                                    AccRc& acc_rc, OnlineSoftmax<kRows>& softmax, bool has_rows) {
  constexpr int kCols = decltype(cute::size<1>(acc_rc))::value;
  using States = PieceStates<Traits, kRows, kCols>;
  const States states(params, consumer);
  FwdTailSplit const& split = params.schedule.split;
  // 16-byte chunks of a group
  constexpr int kGroupChunks = States::kAccChunks <= 16 ? States::kAccChunks : States::kAccChunks / 2;
  static_assert(States::kAccChunks % kGroupChunks == 0);
  const float scale_log2 = softmax.scale_log2;
  auto max_scaled_of = [&](float m) { return m == -INFINITY ? 0.f : m * scale_log2; };
  // Without rows (nothing left, nothing stored) the merge leaves an empty state.
  const int first = split.first_cta(tile.split), last = has_rows ? split.last_cta(tile.split) : first - 1;
  CUTE_UNROLL
  for (int group = 0; group < States::kAccChunks; group += kGroupChunks) {
    float row_max[kRows] = {-INFINITY, -INFINITY};
    float row_sum[kRows] = {0.f, 0.f};
    CUTE_UNROLL
    for (int i = 0; i < kGroupChunks * 4; ++i) acc_rc((group * 4 + i) / kCols, (group * 4 + i) % kCols) = 0.f;
#pragma unroll 1
    for (int cta = first; cta <= last; ++cta) {
      float* state = states.of(cta, tile.split);
      const float4 rows = __ldcg(reinterpret_cast<const float4*>(States::rows(state)));
      float4 values[kGroupChunks];
      CUTE_UNROLL
      for (int i = 0; i < kGroupChunks; ++i) {
        const int value = (group + i) * 4;
        values[i] = __ldcg(reinterpret_cast<const float4*>(States::chunk(state, value / kCols, value % kCols)));
      }
      const float piece_max[kRows] = {rows.x, rows.y}, piece_sum[kRows] = {rows.z, rows.w};
      float old_scale[kRows], piece_scale[kRows];
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const float new_max = fmaxf(row_max[r], piece_max[r]);
        // A row that saw no key so far keeps max -inf: subtract 0 so the factors are 0.
        const float new_scaled = max_scaled_of(new_max);
        old_scale[r] = fast_exp2(row_max[r] * scale_log2 - new_scaled);
        piece_scale[r] = fast_exp2(piece_max[r] * scale_log2 - new_scaled);
        row_sum[r] = row_sum[r] * old_scale[r] + piece_sum[r] * piece_scale[r];
        row_max[r] = new_max;
      }
      CUTE_UNROLL
      for (int i = 0; i < kGroupChunks; ++i) {
        const int value = (group + i) * 4, r = value / kCols, c = value % kCols;
        acc_rc(r, c) = fmaf(values[i].x, piece_scale[r], acc_rc(r, c) * old_scale[r]);
        acc_rc(r, c + 1) = fmaf(values[i].y, piece_scale[r], acc_rc(r, c + 1) * old_scale[r]);
        acc_rc(r, c + 2) = fmaf(values[i].z, piece_scale[r], acc_rc(r, c + 2) * old_scale[r]);
        acc_rc(r, c + 3) = fmaf(values[i].w, piece_scale[r], acc_rc(r, c + 3) * old_scale[r]);
      }
    }
    if (group == 0) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) softmax.row_max[r] = row_max[r], softmax.row_sum[r] = row_sum[r];
    }
  }
}

// A few-row tile that counted last, in every consumer thread: rows [row0, row0 + rows) merged
// from every piece's state and stored (O normalized and converted, LSE), without the epilogue.
// An item is one 16-byte chunk of a piece's state: 4 values of one row, written by thread t
// of the row's consumer (t = 16-row warp, row within it, quad lane q) at columns
// 16 k + 2 q + {0, 1, 8, 9} (the WGMMA accumulator layout).
template <class Traits, int kRows, int kCols>
CUTE_DEVICE void merge_few_rows(FwdParams<Traits> const& params, FwdTile const& tile, int row0, int rows) {
  using ElementO = typename Traits::ElementO;
  using States = PieceStates<Traits, kRows, kCols>;
  constexpr int kRowChunks = kCols / 4;  // per thread and row; 4 threads (a quad) hold a row
  const FwdKernelParams& args = params.args;
  FwdTailSplit const& split = params.schedule.split;
  const int first = split.first_cta(tile.split), last = split.last_cta(tile.split);
  for (int item = threadIdx.x - 128; item < rows * kRowChunks * 4; item += 128 * Traits::kConsumers) {
    const int quad_lane = item % 4, k = item / 4 % kRowChunks, row = item / (4 * kRowChunks);
    const int consumer = row / 64, r = row % 16 / 8;
    const int t = row % 64 / 16 * 32 + row % 8 * 4 + quad_lane;
    const States states_of_t(params, consumer, t);
    const int chunk_offset = States::chunk_offset(r, 4 * k);
    auto value_at = [&](int cta) { return states_of_t.of(cta, tile.split) + chunk_offset; };
    auto stats_at = [&](int cta) { return states_of_t.of(cta, tile.split) + States::kRowsOffset; };
    // Online over batches of pieces, as over key blocks: a batch's loads are all in flight at
    // once, and its pieces are scaled to the batch's new maximum.
    constexpr int kBatch = 8;
    float row_max = -INFINITY, sum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 1
    for (int batch = first; batch <= last; batch += kBatch) {
      float4 values[kBatch], stats[kBatch];
      CUTE_UNROLL
      for (int i = 0; i < kBatch; ++i) {
        if (batch + i <= last) {
          values[i] = __ldcg(reinterpret_cast<const float4*>(value_at(batch + i)));
          stats[i] = __ldcg(reinterpret_cast<const float4*>(stats_at(batch + i)));
        } else {  // past the last piece: weight 0
          values[i] = make_float4(0.f, 0.f, 0.f, 0.f);
          stats[i] = make_float4(-INFINITY, -INFINITY, 0.f, 0.f);
        }
      }
      float new_max = row_max;
      CUTE_UNROLL
      for (int i = 0; i < kBatch; ++i) new_max = fmaxf(new_max, r == 0 ? stats[i].x : stats[i].y);
      // A row that saw no key so far keeps max -inf: subtract 0 so the factors are 0.
      const float max_scaled = new_max == -INFINITY ? 0.f : new_max * args.scale_log2;
      const float old_scale = fast_exp2(row_max * args.scale_log2 - max_scaled);
      sum *= old_scale;
      acc = make_float4(acc.x * old_scale, acc.y * old_scale, acc.z * old_scale, acc.w * old_scale);
      CUTE_UNROLL
      for (int i = 0; i < kBatch; ++i) {
        const float scale = fast_exp2((r == 0 ? stats[i].x : stats[i].y) * args.scale_log2 - max_scaled);
        sum = fmaf(r == 0 ? stats[i].z : stats[i].w, scale, sum);
        acc.x = fmaf(values[i].x, scale, acc.x);
        acc.y = fmaf(values[i].y, scale, acc.y);
        acc.z = fmaf(values[i].z, scale, acc.z);
        acc.w = fmaf(values[i].w, scale, acc.w);
      }
      row_max = new_max;
    }
    const float inv = row_has_no_key(sum) ? 0.f : args.dropout_rescale / sum;  // dropout's 1 / (1 - p)
    const QueryRowOf query = query_row_of(params, tile.head, row0 + row);
    ElementO* out = static_cast<ElementO*>(args.out) + tile.batch * args.out_batch_stride +
                   query.head * args.out_head_stride + query.row * args.out_row_stride + 16 * k + 2 * quad_lane;
    alignas(4) ElementO pair[2][2] = {{ElementO(acc.x * inv), ElementO(acc.y * inv)},
                                      {ElementO(acc.z * inv), ElementO(acc.w * inv)}};
    // Only the call's columns (a multiple of 8: a pair is written whole or not at all).
    const int col = 16 * k + 2 * quad_lane;
    if (col < args.headdim_v) *reinterpret_cast<uint32_t*>(out) = *reinterpret_cast<const uint32_t*>(pair[0]);
    if (col + 8 < args.headdim_v) *reinterpret_cast<uint32_t*>(out + 8) = *reinterpret_cast<const uint32_t*>(pair[1]);
    if (k == 0 && quad_lane == 0 && args.lse != nullptr)
      args.lse[tile.batch * args.lse_batch_stride + query.head * args.lse_head_stride + query.row] =
          row_lse(row_max * args.scale_log2, sum);
  }
}

}  // namespace flashcute::hopper
