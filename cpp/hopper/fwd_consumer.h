// Consumer warpgroups of the Hopper-path forward: S = Q·Kᵀ and O += P·V with WGMMA, online
// softmax in registers, then the epilogue.
//
// Inside a warpgroup the GEMMs of block n-1 overlap the softmax of block n: S(n-1) and P(n)·V(n)
// are issued together, the softmax of S(n-1) runs once S is back while P·V is still in flight, and
// O is rescaled after it lands. Between warpgroups, MmaTurns orders the issue so their GEMM phases
// alternate (not on the hd-128 8-bit tile: fwd_traits.h). The blocks that need the mask (sequence
// tail, causal diagonal, window's right side) come first and run in their own loop, those on the
// window's left side last (mask.h); the bulk runs without mask code and keeps each row's max while
// the weights stay small (online_softmax.h): no max search, no O rescale. Where any thread of a
// warpgroup finds them too large, the warpgroup computes S again and takes the full update. 8-bit
// tiles, which check every weight anyway, search each row's raw scores instead and update only the
// rows whose max moved, without S again or a barrier. The score hook (softcap, ALiBi) runs on S
// before all of this; dropout (dropout.h) zeroes weights of P after the row sums have taken them,
// and O is scaled by 1 / (1 - p) where it is normalized. Key blocks that none of a consumer's rows
// can see are skipped by that consumer alone. A piece of a split tile (fwd_tail_split.h) runs its
// own key blocks and leaves its state; the CTA whose piece finishes a tile merges and stores it
// once its own pieces are done (few-row tiles: all consumer threads together, without the
// epilogue). In a variable-length batch the mask is the tile's sequence's (seq_view.h).
#pragma once

#include <cute/tensor.hpp>

#include "dropout.h"
#include "fragment_views.h"
#include "hopper/fwd_epilogue.h"
#include "hopper/fwd_fp8_scales.h"
#include "hopper/fwd_p_operand.h"
#include "hopper/fwd_params.h"
#include "hopper/fwd_split_pieces.h"
#include "hopper/named_barriers.h"
#include "hopper/pipeline_count.h"
#include "hopper/seq_rows.h"
#include "hopper/wgmma.h"
#include "mask.h"
#include "online_softmax.h"
#include "score_hook.h"
#include "seq_view.h"

namespace flashcute::hopper {

// Dropout on a key block's weights where it is on, after the row sums took them: the dropped
// ones leave P, zeroed once converted (the fp32 weights are dead by then, which leaves the
// Philox calls free registers). Its state is read from the parameters here, not held. Called
// beside the block step rather than inside it: there it pushed the step out of line at hd 256
// (a call, O spilled around it). Drawn earlier, while the block's GEMMs run, the bits spilled
// the 3-consumer tiles.
template <class PRegs, class Offsets>
CUTE_DEVICE void drop_weights(FwdKernelParams const& args, FwdTile const& tile, PRegs& p_regs,
                              Offsets const& offsets_rc, int row_base, int col_base) {
  if (args.dropout_threshold != 0)
    Dropout::of(args).apply_words(p_regs, offsets_rc, row_base, col_base, tile.batch * args.nheads + tile.head);
}

// pipeline_v: V's stages as P·V reads them (8-bit: the transposed copies, fwd_v_transpose.h).
template <class Traits, class PipelineV>
CUTE_DEVICE void consume_fwd(FwdParams<Traits> const& params, typename Traits::SharedStorage& storage,
                             typename Traits::PipelineKV& pipeline_k, PipelineV& pipeline_v, int consumer) {
  using namespace cute;
  constexpr bool kFp8 = Traits::kTransposesV;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kRows = Traits::kRowsPerConsumer;
  const FwdKernelParams& args = params.args;
  const int tid = threadIdx.x % 128;

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid);
  auto thr_pv = mma_pv.get_thread_slice(tid);
  Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{})(_, _, consumer);
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(kFp8 ? storage.vt.data() : storage.v.data()), typename Traits::SmemLayoutVt{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // (MMA, 1, hd/16) descriptors
  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, 1, hd/16, stage)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, 1, keys/16, stage)

  using AccS = decltype(partition_fragment_C(mma_qk, typename Traits::TileS{}));
  Tensor acc_o = partition_fragment_C(mma_pv, typename Traits::TileO{});
  Tensor acc_o_rc = rowcol_view(acc_o);
  constexpr int kThreadRows = decltype(size<0>(acc_o_rc))::value;
  // P: the probabilities in ElementP precision, as the A operand of P·V (fwd_p_operand.h).
  POperand<Traits> p_operand;
  auto&& tOrP = p_operand.a();

  // Score coordinates: this thread's first element plus offsets known at compile time.
  Tensor cS = make_identity_tensor(typename Traits::TileS{});
  Tensor tScS0 = mma_qk.get_thread_slice(0).partition_C(cS);
  Tensor score_offsets_rc = make_tensor(tScS0.data(), rowcol_layout(tScS0.layout()));
  const int thread_row = get<0>(thr_qk.partition_C(cS)(0));
  const int thread_col = get<1>(thr_qk.partition_C(cS)(0));
  const ScoreHook hook = ScoreHook::of(args);
  // Whether this thread's warp (16 of the consumer's rows) has query rows in [0, seqlen_q):
  // pieces of split tiles leave and merge no state for warps without.
  auto warp_has_rows = [&](int consumer_row0) {
    const int warp_row0 = consumer_row0 + thread_row / 16 * 16;
    return warp_row0 < args.seqlen_q && warp_row0 + 16 > 0;
  };
  // Split tiles with few query rows (decoding) merge by chunks over all threads (fwd_split_pieces.h).
  auto few_rows = [&](int row0) {
    const int rows = cute::min(int(Traits::kBlockM), args.seqlen_q - row0);
    return fwd_split_few_rows(rows, Traits::kHeadDimV, Traits::kConsumers);
  };

  const MmaTurns<Traits::kTakesTurns ? Traits::kConsumers : 1> turns{consumer};
  turns.start();
  FwdEpilogue<Traits> epilogue(params, storage, consumer);
  // Pipeline positions: counts where the consumers' registers run out (kLeanState).
  using ConsumerState = std::conditional_t<Traits::kLeanState, PipelineCount<Traits::kStages>,
                                           cutlass::PipelineState<Traits::kStages>>;
  ConsumerState k_state, v_state;
  int iteration = 0;  // tiles run (a variable-length batch skips those past their sequence)
  unsigned split_last = 0;  // bit p: this CTA counted piece p of its split tiles last
  TileWalk<Traits::kClaimsTiles, false, Traits::kWalksHoldUnit, Traits::kSplitsTiles> walk(params.schedule,
                                                                                          storage.claims);
  for (; walk.valid(); walk.advance(iteration)) {
    const FwdTile tile = walk.tile();
    // The tile's sequence (seq_view.h) and its place there (causal pairs per sequence): a tile
    // past its query rows runs nothing (nor loads).
    const SeqView view = SeqView::of(args, tile.batch);
    const int row0 = seq_tile(params, tile.m_block, view.seqlen_q).row0();
    if (row0 >= view.seqlen_q) continue;
    const MaskPolicy mask = view.mask(args);
    KeyBlockRange range = key_block_range<kBlockN>(mask, row0, Traits::kBlockM);
    // This consumer's own rows may see fewer key blocks than the tile's (causal diagonal,
    // window, rows outside [0, seqlen_q)): it skips their GEMMs but still takes its turns and
    // frees their stages, before its blocks ([mine.n_end, range.n_end)) and after them
    // ([n_begin, mine_begin)).
    const int consumer_row0 = row0 + consumer * kRows;
    KeyBlockRange mine = consumer_row0 >= view.seqlen_q || consumer_row0 + kRows <= 0
                             ? KeyBlockRange{0, 0, 0, 0}
                             : key_block_range<kBlockN>(mask, consumer_row0, kRows);
    // A piece of a split tile: its key blocks [key_begin, key_end) only.
    const int n_begin = cute::max(range.n_begin, tile.key_begin);
    range.n_end = cute::min(range.n_end, tile.key_end);
    mine.n_end = cute::max(cute::min(mine.n_end, range.n_end), n_begin);
    const int mine_begin = cute::min(cute::max(mine.n_begin, n_begin), mine.n_end);
    const int my_row = consumer_row0 + thread_row;
    // 8-bit: the tile's descales (fwd_fp8_scales.h); Q's and K's per-head ones fold into the scale.
    // kLeanState: they wait in shared memory, a copy per warp, and each key block reads its
    // part there (held in registers through the key blocks, they spilled).
    Fp8TileScales scales{};
    float v_part = 0.f;
    if constexpr (kFp8) {
      scales = Fp8TileScales::of(args, tile.batch, tile.head, consumer_row0, hook.active(), v_part);
      // kLeanState: v_ref at once (a part held to the first block spilled the consumers).
      if (Traits::kLeanState && scales.v_blocks != nullptr) scales.set_v_ref(Fp8TileScales::reduce_v_ref(v_part));
    }
    auto stash_slot = [&] { return opaque_consumer_thread() / 32 + 4 * consumer; };
    if constexpr (Traits::kLeanState) {
      __syncwarp();  // the previous tile's reads are done
      if (threadIdx.x % 32 == 0) storage.fp8_scales[stash_slot()] = scales;
      __syncwarp();
    }
    auto tile_scales = [&]() -> Fp8TileScales const& {
      if constexpr (Traits::kLeanState) return storage.fp8_scales[stash_slot()];
      else return scales;
    };
    // V block descales: v_ref completed where the tile's first GEMMs are issued (or where the
    // consumer has none), before any P or O takes it.
    auto settle_v_ref = [&] {
      if constexpr (kFp8 && !Traits::kLeanState) {
        if (scales.v_blocks != nullptr) scales.set_v_ref(Fp8TileScales::reduce_v_ref(v_part));  // uniform
      }
    };
    OnlineSoftmax<kThreadRows, kFp8> softmax(kFp8 ? args.scale_log2 * scales.qk : args.scale_log2);
    clear(acc_o);
    storage.q_full.wait(iteration & 1);

    // The tile's coordinates where needed past its first key block: decoded again where the
    // consumers take 240 registers, so that they are not live through the key blocks.
    auto tile_again = [&] {
      if constexpr (Traits::kLeanState) return walk.tile();
      else return tile;
    };
    // Softcap and ALiBi on key block n's raw scores (the slope read here, not held).
    auto apply_hook = [&](auto& acc_s_rc, int n) {
      const FwdTile t = tile_again();
      hook.apply(acc_s_rc, score_offsets_rc, my_row, n * kBlockN + thread_col, mask.offset(),
                 hook.alibi_slope(t.batch, t.head));
    };

    // Dropout (16-bit only: 8-bit calls refuse it) on P of key block n.
    auto drop_weights_of = [&](int n) {
      if constexpr (!kFp8) drop_weights(args, tile, p_operand.regs, score_offsets_rc, my_row, n * kBlockN + thread_col);
    };

    // 8-bit: key block n's descales (fwd_fp8_scales.h) on its raw scores and its P scale, before
    // the hook. Loaded before the block's pipeline waits; where the consumers keep 240
    // registers (kLeanState), once its GEMMs are issued (earlier measured slower there).
    using Fp8Block = Fp8TileScales::Block;
    using Fp8Raw = Fp8TileScales::Raw;
    auto fp8_raw = [&](int n) {
      if constexpr (kFp8) return tile_scales().raw(n, kBlockN);
      else return Fp8Raw{};
    };
    auto fp8_block = [&](Fp8Raw const& raw) {
      if constexpr (kFp8) return tile_scales().block(raw);
      else return Fp8Block{};
    };
    // Returns the factor left on the scores: where `fold` (8-bit unmasked blocks' exp2 takes
    // it, OnlineSoftmax::update_near_kept_max), K's block descale stays out of the scores, one
    // FMUL per score fewer.
    auto descale_block = [&](auto& acc_s_rc, Fp8Block const& factors, bool fold = false) {
      float left = 1.f;
      if constexpr (kFp8) {
        if (tile_scales().multiplies) {
          if (fold && factors.s_factor > 0.f) left = factors.s_factor;  // a max of raw scores stays one
          else Fp8TileScales::multiply(acc_s_rc, factors.s_factor);
        }
        softmax.p_log2 = factors.p_log2;
        softmax.p_inv = factors.p_inv;
      }
      return left;
    };

    auto scores_done = [&](AccS& acc_s, Fp8Block const& factors, int n, bool masked, float (&correction)[kThreadRows]) {
      pipeline_k.consumer_release(k_state);
      ++k_state;
      Tensor acc_s_rc = rowcol_view(acc_s);
      descale_block(acc_s_rc, factors);
      if (hook.active()) apply_hook(acc_s_rc, n);  // S is raw here
      if (masked) mask.apply(acc_s_rc, score_offsets_rc, my_row, n * kBlockN + thread_col);
      softmax.update_scores(acc_s_rc, correction);
    };

    int n = range.n_end - 1;
    const bool skips = mine.n_end < range.n_end;
    if (skips) epilogue.release_previous_o(iteration);  // before waiting for any V
    auto skip_block = [&] {
      turns.wait();
      turns.pass();
      pipeline_k.consumer_wait(k_state);
      pipeline_k.consumer_release(k_state);
      ++k_state;
      pipeline_v.consumer_wait(v_state);
      pipeline_v.consumer_release(v_state);
      ++v_state;
    };
    for (; n >= mine.n_end; --n) skip_block();
    if (n >= mine_begin) {
      {
        AccS acc_s;
        float correction[kThreadRows];
        Fp8Raw raw{};
        if constexpr (!Traits::kLeanState) raw = fp8_raw(n);
        pipeline_k.consumer_wait(k_state);
        turns.wait();
        wgmma_issue<true>(mma_qk, tSrQ, tSrK(_, _, _, k_state.index()), acc_s);
        turns.pass();
        settle_v_ref();
        if constexpr (Traits::kLeanState) raw = fp8_raw(n);
        const Fp8Block factors = fp8_block(raw);
        if (!skips) epilogue.release_previous_o(iteration);
        warpgroup_wait<0>();
        scores_done(acc_s, factors, n, mine.needs_mask(n), correction);  // acc_o is still zero
        p_operand.set(acc_s);
        drop_weights_of(n);
      }
      // Variable-length batches: V rows past the sequence's used keys (the next sequence's, or
      // unused cache slots) may hold anything, NaN included, and 0 · NaN would reach O. Only
      // the first block a consumer computes can hold such rows; it zeroes them before its P·V.
      if (!kFp8 && !SeqView::fixed(args) && (n + 1) * kBlockN > view.seqlen_k) {
        // All 128 threads of this consumer; other consumers may write the same zeros.
        pipeline_v.consumer_wait(v_state);
        Tensor sV = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutV{});
        zero_tile_rows(sV(_, _, v_state.index()), view.seqlen_k - n * kBlockN, opaque_consumer_thread(), 128);
        cutlass::arch::fence_view_async_shared();
        epilogue_barrier_sync(consumer);
      }
      // One key block: S(n) = Q·K(n)ᵀ issued with P(n+1)·V(n+1), softmax of S(n) meanwhile.
      auto step = [&](int n, auto masked) {
        AccS acc_s;
        float correction[kThreadRows];
        Fp8Raw raw{};
        if constexpr (!Traits::kLeanState) raw = fp8_raw(n);
        pipeline_k.consumer_wait(k_state);
        pipeline_v.consumer_wait(v_state);
        turns.wait();
        wgmma_issue<true>(mma_qk, tSrQ, tSrK(_, _, _, k_state.index()), acc_s);
        wgmma_issue<false>(mma_pv, tOrP, tOrV(_, _, _, v_state.index()), acc_o);
        turns.pass();
        if constexpr (Traits::kLeanState) raw = fp8_raw(n);
        const Fp8Block factors = fp8_block(raw);
        warpgroup_wait<1>();
        // Unmasked blocks keep the row max where the weights stay small (online_softmax.h);
        // otherwise S is computed again and goes through the full update (8-bit: per row,
        // from the S at hand).
        constexpr bool kKeepMax = !decltype(masked)::value;
        bool max_kept = false;
        bool rescales = true;  // acc_o takes correction[]
        float block_sum[kThreadRows];
        if constexpr (kKeepMax) {
          Tensor acc_s_rc = rowcol_view(acc_s);
          // The hook needs true scores; without it an 8-bit block's descale folds into the exp2.
          [[maybe_unused]] const float left = descale_block(acc_s_rc, factors, !hook.active());
          if (hook.active()) apply_hook(acc_s_rc, n);
          if constexpr (kFp8) {
            // 8-bit: each row decides alone, and S is never needed again
            // (OnlineSoftmax::update_near_kept_max).
            rescales = softmax.template update_near_kept_max<!Traits::kTakesTurns>(acc_s_rc, correction, left);
            pipeline_k.consumer_release(k_state);
            ++k_state;
          } else {
            max_kept = all_of_threads(softmax.exp2_against_kept_max(acc_s_rc, block_sum),
                                      int(FwdBarrier::kKeptMax0) + consumer, 128);
            rescales = !max_kept;
          }
          if (!kFp8 && !max_kept && Traits::kHeadDim < 256) {
            wgmma_issue<true>(mma_qk, tSrQ, tSrK(_, _, _, k_state.index()), acc_s);
          } else if (!kFp8 && !max_kept) {
            // hd 256: the descriptors made afresh from opaque addresses. Reused from the issue
            // above, they stay live through the softmax and ptxas spills; rebuilt at the smaller
            // head dims, they cost the kept-max path 7-10 instructions.
            auto* q_ptr = storage.q.data();
            auto* k_ptr = storage.k.data();
            asm volatile("" : "+l"(q_ptr), "+l"(k_ptr));
            Tensor sQ_again = make_tensor(make_smem_ptr(q_ptr), typename Traits::SmemLayoutQ{})(_, _, consumer);
            Tensor sK_again = make_tensor(make_smem_ptr(k_ptr), typename Traits::SmemLayoutK{});
            wgmma_issue<true>(mma_qk, thr_qk.partition_fragment_A(sQ_again),
                              thr_qk.partition_fragment_B(sK_again)(_, _, _, k_state.index()), acc_s);
          }
        }
        if (max_kept) {
          pipeline_k.consumer_release(k_state);
          ++k_state;
          softmax.add_block_sums(block_sum);
        } else if (!(kFp8 && kKeepMax)) {
          if constexpr (kKeepMax) warpgroup_wait<0>();
          scores_done(acc_s, factors, n, decltype(masked)::value, correction);  // S computed again: raw
        }
        warpgroup_wait<0>();
        pipeline_v.consumer_release(v_state);
        ++v_state;
        if (rescales) OnlineSoftmax<kThreadRows, kFp8>::rescale(acc_o_rc, correction);
        p_operand.set(acc_s);
      };
      // Dropout after each step (kept max or full update alike), as after the first block.
      for (--n; n >= mine_begin && n >= mine.n_unmasked; --n) {
        step(n, cute::true_type{});
        drop_weights_of(n);
      }
      for (; n >= mine_begin && n >= mine.n_unmasked_begin; --n) {
        step(n, cute::false_type{});
        drop_weights_of(n);
      }
      for (; n >= mine_begin; --n) {
        step(n, cute::true_type{});
        drop_weights_of(n);
      }
      if constexpr (!Traits::kOAliasesQ) storage.q_empty.arrive();  // last Q·Kᵀ has completed

      pipeline_v.consumer_wait(v_state);
      turns.wait();
      wgmma_issue<false>(mma_pv, tOrP, tOrV(_, _, _, v_state.index()), acc_o);
      turns.pass();
      warpgroup_wait<0>();
      pipeline_v.consumer_release(v_state);
      ++v_state;
      for (; n >= n_begin; --n) skip_block();
    } else {
      if (range.n_end > n_begin) {  // the turn the other consumers take for their last P·V
        turns.wait();
        turns.pass();
      }
      if constexpr (!Traits::kOAliasesQ) storage.q_empty.arrive();
      if (!skips) epilogue.release_previous_o(iteration);
      settle_v_ref();
    }

    // A piece of a split tile leaves its state; the CTA whose piece finishes the tile merges
    // and stores it below, after its own pieces.
    if (tile.split >= 0) {  // never with 8-bit P (fwd_launch.h)
      if constexpr (!kFp8) {
        if (leave_split_piece(params, consumer, tile, acc_o_rc, softmax, warp_has_rows(consumer_row0), few_rows(row0)))
          split_last |= 1u << walk.piece;
      }
      if constexpr (Traits::kOAliasesQ) {
        if (tid == 0) storage.q_empty.arrive();  // no O was staged in Q's buffer
      }
      ++iteration;
      continue;
    }
    float lse[kThreadRows];
    softmax.finalize(acc_o_rc, lse, kFp8 ? tile_scales().o_factor : args.dropout_rescale);
    epilogue.store(acc_o, lse, tile_again(), consumer_row0);
    ++iteration;
  }
  // Split tiles this CTA counted last: merged from every piece's state, stored as above.
  for (int piece = 0; piece < walk.pieces; ++piece) {
    if (!(split_last >> piece & 1)) continue;
    const FwdTile tile = walk.piece_tile(piece);
    const int row0 = tile_row0(params, tile.m_block);
    if (few_rows(row0)) {
      merge_few_rows<Traits, kThreadRows, decltype(size<1>(acc_o_rc))::value>(
          params, tile, row0, cute::min(int(Traits::kBlockM), args.seqlen_q - row0));
      continue;
    }
    OnlineSoftmax<kThreadRows> softmax(args.scale_log2);
    const int consumer_row0 = row0 + consumer * kRows;
    merge_split_pieces(params, consumer, tile, acc_o_rc, softmax, warp_has_rows(consumer_row0));
    float lse[kThreadRows];
    softmax.finalize(acc_o_rc, lse, args.dropout_rescale);
    epilogue.store(acc_o, lse, tile, consumer_row0);
  }
  epilogue.drain();
  // Consumer 0 takes the turn the last consumer passed after its final GEMMs, so every
  // arrival on the turn barriers has its matching wait.
  if (consumer == 0) turns.wait();
}

}  // namespace flashcute::hopper
