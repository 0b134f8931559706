// The V transpose of 8-bit tiles: 8-bit WGMMA reads its B operand K-major only, so P·V needs
// V as (hdv, keys) with keys contiguous, while TMA lands it as the caller stores it, (keys,
// hdv). Warps 1-3 of the producer warpgroup (warp 0 issues the TMA loads) copy each landed V
// stage into a stage of its own, overlapped with the consumers' GEMMs:
//
// - ldmatrix.trans reads four 8 x 8 matrices of 16-bit pairs (16 keys x 32 columns) and leaves
//   each thread two neighbouring keys of two neighbouring columns per matrix;
// - two byte permutes per column pair gather four keys of one column into a word, in the key
//   order the P operand's registers need (fwd_p_operand.h: column 4t + j holds key
//   2t + (j & 1) + 8 (j >> 1)), so that P never moves between threads;
// - stmatrix writes the words as rows of the transposed tile. Rows 4-7 of each matrix take
//   the other column of their pair: a matrix of even columns alone (rows two apart) puts two
//   rows on the same banks of the swizzled tile, one of odd and even columns none.
//
// Rows of V past a variable-length sequence's used keys (which may hold NaN) are zeroed before
// the copy, as the 16-bit consumers do in V's own buffer.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "hopper/fwd_params.h"
#include "hopper/seq_rows.h"
#include "mask.h"
#include "seq_view.h"

namespace flashcute::hopper {

// The transposing warps meet here (after zeroing rows, before reading them).
constexpr int kTransposeBarrier = 15;

CUTE_DEVICE void ldmatrix_x4_trans(uint32_t address, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

CUTE_DEVICE void stmatrix_x4(uint32_t address, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(address), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

template <class Traits>
CUTE_DEVICE void transpose_v(FwdParams<Traits> const& params, typename Traits::SharedStorage& storage,
                             typename Traits::PipelineKV& pipeline_v, typename Traits::PipelineVt& pipeline_vt) {
  using namespace cute;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDimV = Traits::kHeadDimV;
  constexpr int kThreads = 32 * Traits::kTransposeWarps;
  constexpr int kUnits = Traits::kTransposeUnits;
  static_assert(kBlockN % 16 == 0 && kHeadDimV % 32 == 0);
  const FwdKernelParams& args = params.args;
  const int thread = threadIdx.x - 32;  // warps 1..3 of warpgroup 0
  const int warp = thread / 32, lane = thread % 32;

  Tensor sV = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutV{});    // (keys, hdv, stage)
  Tensor sVt = make_tensor(make_smem_ptr(storage.vt.data()), typename Traits::SmemLayoutVt{});  // (hdv, keys, stage)
  // This lane's row of its ldmatrix / stmatrix matrix m = lane / 8: matrices 0-3 are (keys 0-7,
  // cols 0-15), (keys 8-15, cols 0-15), (keys 0-7, cols 16-31), (keys 8-15, cols 16-31) of a unit
  // on the way in; on the way out, matrix m's row r is column 16 (m >> 1) + 2r + 1 when
  // (m & 1) differs from r >= 4, else the even one before it. stmatrix takes row r of every
  // matrix from lanes 4r..4r+3, so lanes 16-31 put their odd column first.
  const int m = lane / 8, r = lane % 8;
  const int load_key = 8 * (m & 1) + r, load_col = 16 * (m >> 1);
  const int store_col = 16 * (m >> 1) + 2 * r + ((m & 1) ^ (r >> 2));
  const uint32_t first_select = lane < 16 ? 0x6420 : 0x7531, second_select = first_select ^ 0x1111;
  // This lane's offsets in a stage for each of its warp's units, computed once (a stage's
  // swizzle pattern is the same in every stage): in registers where the warps keep enough,
  // else in a table in shared memory, one 8-byte load per unit.
  constexpr int kMyUnits = Traits::kTransposeUnitsPerWarp;
  constexpr bool kKeepsOffsets = Traits::kTransposeKeepsOffsets;
  const uint32_t v_base = cast_smem_ptr_to_uint(storage.v.data());
  const uint32_t vt_base = cast_smem_ptr_to_uint(storage.vt.data());
  constexpr uint32_t kVStageBytes = kBlockN * kHeadDimV, kVtStageBytes = kBlockN * kHeadDimV;
  static_assert(cosize_v<typename Traits::SmemLayoutV> == Traits::kStages * kVStageBytes &&
                cosize_v<typename Traits::SmemLayoutVtBuffer> == Traits::kStages * kVtStageBytes);
  uint32_t v_offset[kKeepsOffsets ? kMyUnits : 1], vt_offset[kKeepsOffsets ? kMyUnits : 1];
  CUTE_UNROLL
  for (int i = 0; i < kMyUnits; ++i) {
    const int unit = cute::min(warp + i * Traits::kTransposeWarps, kUnits - 1);
    const int key0 = unit % (kBlockN / 16) * 16, col0 = unit / (kBlockN / 16) * 32;
    const uint32_t v_at = cast_smem_ptr_to_uint(&sV(key0 + load_key, col0 + load_col, 0)) - v_base;
    const uint32_t vt_at = cast_smem_ptr_to_uint(&sVt(col0 + store_col, key0, 0)) - vt_base;
    if constexpr (kKeepsOffsets) v_offset[i] = v_at, vt_offset[i] = vt_at;
    else storage.transpose_offsets[i * kThreads + thread] = make_uint2(v_at, vt_at);  // read by this thread only
  }

  auto v_state = cutlass::PipelineState<Traits::kStages>();
  auto vt_state = cutlass::make_producer_start_state<typename Traits::PipelineVt>();
  int step = 0;  // tiles run (the claimed order hands on only tiles with rows)
  for (TileWalk<Traits::kClaimsTiles> walk(params.schedule, storage.claims); walk.valid(); walk.advance(++step)) {
    const FwdTile tile = walk.tile();
    const SeqView view = SeqView::of(args, tile.batch);
    const TileKeyBlocks blocks = tile_key_blocks(params, tile, view);
    for (int n = blocks.n_end - 1; n >= blocks.n_begin; --n) {
      pipeline_v.consumer_wait(v_state);
      const int stage = v_state.index();
      if (!SeqView::fixed(args) && (n + 1) * kBlockN > view.seqlen_k) {
        zero_tile_rows(sV(_, _, stage), view.seqlen_k - n * kBlockN, thread, kThreads);
        named_barrier_sync(kTransposeBarrier, kThreads);
      }
      pipeline_vt.producer_acquire(vt_state);
      const uint32_t v_stage = v_base + stage * kVStageBytes, vt_stage = vt_base + vt_state.index() * kVtStageBytes;
      auto transpose_unit = [&](uint32_t v_at, uint32_t vt_at) {
        uint32_t in[4], out[4];
        ldmatrix_x4_trans(v_stage + v_at, in);
        // A column of keys 2t, 2t+1, 2t+8, 2t+9 per word: 0x6420 the even one, 0x7531 the odd one.
        out[0] = __byte_perm(in[0], in[1], first_select);
        out[1] = __byte_perm(in[0], in[1], second_select);
        out[2] = __byte_perm(in[2], in[3], first_select);
        out[3] = __byte_perm(in[2], in[3], second_select);
        stmatrix_x4(vt_stage + vt_at, out);
      };
      CUTE_UNROLL
      for (int i = 0; i < kMyUnits; ++i) {
        if (warp + i * Traits::kTransposeWarps < kUnits) {
          if constexpr (kKeepsOffsets) {
            transpose_unit(v_offset[i], vt_offset[i]);
          } else {
            const uint2 at = storage.transpose_offsets[i * kThreads + thread];
            transpose_unit(at.x, at.y);
          }
        }
      }
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by WGMMA
      pipeline_vt.producer_commit(vt_state);
      pipeline_v.consumer_release(v_state);
      ++v_state;
      ++vt_state;
    }
  }
}

}  // namespace flashcute::hopper
