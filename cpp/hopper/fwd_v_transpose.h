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
#include "hopper/fwd_v_transpose_units.h"
#include "hopper/pipeline_count.h"
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
  using Units = TransposeUnits<Traits>;
  Tensor sV = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutV{});  // (keys, hdv, stage)
  // This lane's constants: its warp (0..2), its byte-permute selector and its offsets in unit 0
  // of stage 0 (fwd_v_transpose_units.h). stmatrix takes row r of every matrix from lanes
  // 4r..4r+3, so lanes 16-31 put their odd column first (TransposeUnits::store_col).
  struct Lane {
    uint32_t thread, warp, first_select, v_at, vt_at;
  };
  auto lane_constants = [&] {
    int tid;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));  // read where called, not held (kLeanState)
    Lane l;
    l.thread = uint32_t(tid) - 32;  // warps 1..3 of warpgroup 0
    const uint32_t lane = l.thread % 32;
    l.warp = l.thread / 32;
    l.first_select = lane < 16 ? 0x6420 : 0x7531;
    l.v_at = cast_smem_ptr_to_uint(storage.v.data()) + Units::v_lane(lane);
    l.vt_at = cast_smem_ptr_to_uint(storage.vt.data()) + Units::vt_lane(lane);
    return l;
  };
  Lane held{};
  if constexpr (!Traits::kLeanState) held = lane_constants();

  // V's and the transposed stages advance together, once per key block: one count for both
  // (pipeline_count.h). Where these warps keep 24 registers (kLeanState), little stays live
  // across blocks: the lane's constants are read again per block.
  PipelineCount<Traits::kStages> count;
  int step = 0;  // tiles run (the claimed order hands on only tiles with rows)
  for (TileWalk<Traits::kClaimsTiles, false, false, Traits::kSplitsTiles> walk(params.schedule, storage.claims);
       walk.valid(); walk.advance(++step)) {
    const FwdTile tile = walk.tile();
    const SeqView view = SeqView::of(args, tile.batch);
    const TileKeyBlocks blocks = tile_key_blocks(params, tile, view);
    // Only the first block visited, the tile's last, can reach past the sequence's used keys:
    // its rows from zero_from on are zeroed (kBlockN: none).
    int zero_from = kBlockN;
    if (!SeqView::fixed(args) && blocks.n_end > blocks.n_begin && blocks.n_end * kBlockN > view.seqlen_k)
      zero_from = view.seqlen_k - (blocks.n_end - 1) * kBlockN;
    for (int left = blocks.n_end - blocks.n_begin; left > 0; --left, ++count) {
      const int stage = count.index();
      pipeline_v.consumer_wait(count);
      const Lane lane = Traits::kLeanState ? lane_constants() : held;
      if (zero_from < kBlockN) {
        zero_tile_rows(sV(_, _, stage), zero_from, int(lane.thread), kThreads);
        named_barrier_sync(kTransposeBarrier, kThreads);
        zero_from = kBlockN;
      }
      pipeline_vt.producer_acquire(PipelineCount<Traits::kStages, true>{count.count});
      // A unit's address: this lane's offset in unit 0 XOR the unit's bits, plus its rows.
      // Stage bases are multiples of 1024 bytes, so adding one before the XOR leaves the
      // swizzled bits alone.
      const uint32_t v_at = lane.v_at + stage * Units::kVStageBytes;
      const uint32_t vt_at = lane.vt_at + stage * Units::kVtStageBytes;
      const uint32_t first_select = lane.first_select;
      // One unit: its V rows at v, its transposed rows at vt.
      auto transpose_at = [&](uint32_t v, uint32_t vt) {
        uint32_t in[4], out[4];
        ldmatrix_x4_trans(v, in);
        // A column of keys 2t, 2t+1, 2t+8, 2t+9 per word: 0x6420 the even one, 0x7531 the odd one.
        out[0] = __byte_perm(in[0], in[1], first_select);
        out[1] = __byte_perm(in[0], in[1], first_select ^ 0x1111);
        out[2] = __byte_perm(in[2], in[3], first_select);
        out[3] = __byte_perm(in[2], in[3], first_select ^ 0x1111);
        stmatrix_x4(vt, out);
      };
      auto transpose_unit = [&](int unit) {
        transpose_at((v_at ^ Units::v_xor(unit)) + Units::v_rows(unit),
                     (vt_at ^ Units::vt_xor(unit)) + Units::vt_rows(unit));
      };
      // Warp w takes units w, w + 3, ... With registers to spare, one unrolled copy of the loop
      // per warp makes every unit's bits and rows constants. With 24 (kLeanState), the warp
      // walks base units w, w + 3, ... of V's first swizzle atom, each with its units in the
      // other atoms (TransposeUnits::kBaseUnits): unrolled, ptxas computes every unit's
      // address up front, more registers than the warps keep.
      static_assert(Traits::kTransposeWarps == 3);
      if constexpr (!Traits::kLeanState) {
        auto transpose_units = [&](auto warp_c) {
          CUTE_UNROLL
          for (int i = 0; i < Traits::kTransposeUnitsPerWarp; ++i) {
            const int unit = decltype(warp_c)::value + i * Traits::kTransposeWarps;
            if (unit < kUnits) transpose_unit(unit);
          }
        };
        if (lane.warp == 0) transpose_units(Int<0>{});
        else if (lane.warp == 1) transpose_units(Int<1>{});
        else transpose_units(Int<2>{});
      } else {
#pragma unroll 1
        for (int base = lane.warp; base < Units::kBaseUnits; base += Traits::kTransposeWarps) {
          const uint32_t v_base = (v_at ^ Units::v_xor(base)) + Units::v_rows(base);
          const uint32_t vt_base = (vt_at ^ Units::vt_xor(base)) + Units::vt_rows(base);
          CUTE_UNROLL
          for (int atom = 0; atom < Units::kAtomsV; ++atom)
            transpose_at(v_base + atom * Units::v_atom_step(), vt_base + atom * Units::vt_atom_step());
        }
      }
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by WGMMA
      pipeline_vt.producer_commit(PipelineCount<Traits::kStages, true>{count.count});
      pipeline_v.consumer_release(count);
    }
  }
}

}  // namespace flashcute::hopper
