// Consumer warpgroups of the Hopper-path backward: per query block, the five GEMMs of
// bwd_traits.h around P and dS in registers, the dQ partial added to global memory from
// registers, and at the end dK (scaled) and dV through shared memory to TMA stores.
//
// Order inside a block: Sᵀ and dPᵀ are issued together; P is computed as soon as Sᵀ is back,
// then dS; dV += Pᵀ·dO runs while dS goes to shared memory; then dQ = dS·K (of the previous
// block where dQ needs both consumers' dS) and dK += dSᵀ·Q, and the dQ partial is added while
// dK runs. With Traits::kDvAfterDq, dV is issued after dK instead, and the partial is added
// while both run. The Q and dO stages are released once every GEMM reading them has completed.
// Dropout (dropout.h; in the score-hook variant): the block's keep bits Z are computed while
// dPᵀ runs, dS = P∘(Z·dPᵀ/(1 − p) − rowsum(dO∘O)) (O holds the dropout already), dV takes
// P∘Z and is scaled by 1 / (1 − p) at the end.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "dropout.h"
#include "fragment_views.h"
#include "hopper/bwd_config.h"
#include "hopper/bwd_params.h"
#include "hopper/bwd_split_sums.h"
#include "dq_reduce.h"
#include "hopper/named_barriers.h"
#include "hopper/seq_rows.h"
#include "hopper/wgmma.h"
#include "mask.h"
#include "online_softmax.h"  // fast_exp2
#include "score_hook.h"
#include "seq_view.h"

namespace flashcute::hopper {

template <class Traits, bool kDeferDq, bool kScoreHook>
CUTE_DEVICE void consume_bwd(BwdParams<Traits> const& params, typename Traits::SharedStorage& storage,
                             typename Traits::PipelineQ& pipeline_q, typename Traits::PipelineDo& pipeline_do,
                             int consumer, BwdTile const& tile) {
  using namespace cute;
  using ElementP = typename Traits::ElementP;
  using ElementGrad = typename Traits::ElementGrad;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kDqElems = Traits::kDqElems;
  const BwdKernelParams& args = params.args;
  const int tid = threadIdx.x % 128;
  const int n_block = tile.n_block, kv_head = tile.kv_head, batch = tile.batch;

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmaDkv mma_dkv;
  typename Traits::TiledMmaDq mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);

  Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(storage.dout.data()), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQt{});
  Tensor sdOt = make_tensor(make_smem_ptr(storage.dout.data()), typename Traits::SmemLayoutQt{});
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutKV{});
  Tensor sKt = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutKt{});
  Tensor sdS = make_tensor(make_smem_ptr(storage.ds.data()), typename Traits::SmemLayoutDs{});
  Tensor sdSt = make_tensor(make_smem_ptr(storage.ds.data()), typename Traits::SmemLayoutDst{});

  // Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ: this consumer's 64 keys against the block's query rows.
  Tensor tSrK = thr_sdp.partition_fragment_A(sK(_, _, consumer));
  Tensor tSrV = thr_sdp.partition_fragment_A(sV(_, _, consumer));
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);    // (MMA, N, K, stage)
  Tensor tSrdO = thr_sdp.partition_fragment_B(sdO);
  // dV += Pᵀ·dO, dK += dSᵀ·Q.
  Tensor tDrdO = thr_dkv.partition_fragment_B(sdOt);  // (MMA, N, K, stage)
  Tensor tDrQ = thr_dkv.partition_fragment_B(sQt);
  // dQ = dS·K over key chunks: this consumer's columns of K, as (cols, keys, consumer), and
  // its rows of dS, as (rows, keys, consumer, buffer).
  Tensor sKt_cols = local_tile(sKt, Shape<Int<Traits::kDqCols>, Int<Traits::kKeysPerConsumer>, Int<Traits::kConsumers>>{},
                              make_coord(Traits::kDqSplitCols ? consumer : 0, 0, 0));
  Tensor sdS_rows = local_tile(sdS, Shape<Int<Traits::kDqRows>, Int<Traits::kKeysPerConsumer>, Int<Traits::kConsumers>, _2>{},
                               make_coord(Traits::kDqSplitRows ? consumer : 0, 0, 0, 0));
  Tensor tQrdS = thr_dq.partition_fragment_A(sdS_rows);  // (MMA, M, K, consumer, buffer)
  Tensor tQrK = thr_dq.partition_fragment_B(sKt_cols);  // (MMA, N, K, consumer)

  Tensor acc_dk = partition_fragment_C(mma_dkv, typename Traits::TileKV{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, typename Traits::TileKV{});
  clear(acc_dk);
  clear(acc_dv);
  using AccS = decltype(partition_fragment_C(mma_sdp, typename Traits::TileSt{}));
  // Pᵀ and dSᵀ in ElementP precision, laid out as A operands of the dV and dK GEMMs.
  Tensor p_regs = make_tensor<ElementP>(make_layout(shape(AccS{})));
  Tensor ds_regs = make_tensor<ElementP>(make_layout(shape(AccS{})));
  Tensor tDrP = make_tensor(p_regs.data(), acc_to_a_operand_layout(p_regs.layout()));
  Tensor tDrdS = make_tensor(ds_regs.data(), acc_to_a_operand_layout(ds_regs.layout()));

  // dSᵀ registers -> shared memory (stmatrix onto the key-major view of the dS buffer).
  auto ds_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomDs{}, mma_sdp);
  auto ds_thr_copy = ds_copy.get_thread_slice(tid);
  Tensor tDSsdS = ds_thr_copy.partition_D(sdSt);  // (CPY, M, N, consumer, buffer)
  Tensor tDSrdS = ds_thr_copy.retile_S(ds_regs);

  // Score coordinates: rows are keys, columns query rows (see mask.h).
  Tensor cS = make_identity_tensor(typename Traits::TileSt{});
  Tensor tScS0 = mma_sdp.get_thread_slice(0).partition_C(cS);
  Tensor offsets_rc = make_tensor(tScS0.data(), rowcol_layout(tScS0.layout()));
  constexpr int kRows = decltype(size<0>(offsets_rc))::value;
  constexpr int kCols = decltype(size<1>(offsets_rc))::value;
  constexpr bool kPrefetchStats = kCols <= 16;
  const int thread_key = get<0>(thr_sdp.partition_C(cS)(0));
  const int thread_col = get<1>(thr_sdp.partition_C(cS)(0));
  // The pair's sequence (seq_view.h); fixed lengths in a kernel compiled for them alone.
  constexpr bool kFixedOnly = kDeferDq && bwd_deferred_dq_fixed_only(kHeadDim);
  const SeqView view =
      kFixedOnly ? SeqView{0, 0, args.seqlen_q, args.seqlen_k, args.seqlen_k} : SeqView::of(args, batch);
  const MaskPolicy mask = view.mask(args);
  const ScoreHook hook = ScoreHook::of(args);
  const int key0 = n_block * Traits::kBlockN + consumer * Traits::kKeysPerConsumer;
  const QueryBlockRange range = query_block_range<kBlockM, Traits::kBlockN>(mask, n_block * Traits::kBlockN);

  const int dq_region = Traits::kDqSplitKeys ? 0 : consumer;
  const int pair_slot0 = (batch * args.nheads_kv + kv_head - params.pair_begin) * args.heads_per_kv;
  const int consumer_barrier = int(BwdBarrier::kConsumer0) + consumer;

  // Q and dO stages advance together: one state serves both pipelines.
  cutlass::PipelineState<Traits::kStages> stage;
  storage.kv_full.wait(0);
  // Variable-length batches: K and V rows past the sequence's used keys may hold anything, NaN
  // included; masked scores give P = 0 there, but 0 · NaN would still reach dS (through dPᵀ =
  // V·dOᵀ) and dQ (through K). Each consumer zeroes its own keys' rows; every dQ GEMM reads
  // both consumers' K.
  if (!kFixedOnly && !SeqView::fixed(args) && (n_block + 1) * Traits::kBlockN > view.seqlen_k) {
    zero_tile_rows(sK(_, _, consumer), view.seqlen_k - key0, tid, 128);
    zero_tile_rows(sV(_, _, consumer), view.seqlen_k - key0, tid, 128);
    cutlass::arch::fence_view_async_shared();
    named_barrier_sync(int(BwdBarrier::kDsReady), 128 * Traits::kConsumers);
  }
  // kDeferDq (bwd_launch.h: hd 64 always, hd 128 for long loops): block t's dQ is issued one
  // block late, behind block t+1's dS, from both consumers' dS(t) in buffer t % 2. A consumer
  // then never waits for the other's dS of the block it is working on, so the two drift out of
  // phase and one's exp2 and dS run under the other's GEMMs; in lockstep both consumers' exp2
  // leave the tensor cores idle. The last dQ then runs after the last dK, and the consumers
  // start in phase, which hd 128's short loops do not win back. Named barriers, arrived by one
  // consumer and synced by the other:
  //   ds_full(owner, b): the owner's dS in buffer b is written;
  //   ds_free(owner, b): the other consumer's dQ GEMM reading it has completed.
  static_assert(!kDeferDq || !Traits::kDqSplitKeys, "split 1 needs no other consumer's dS");
  const int blocks = tile.block_end - tile.block_begin;
  const int other = consumer ^ 1;
  auto ds_full = [](int owner, int b) { return int(BwdBarrier::kDsFull0) + 2 * owner + b; };
  auto ds_free = [](int owner, int b) { return int(BwdBarrier::kDsFree0) + 2 * owner + b; };
  int t = 0;             // blocks done by this CTA, over the GQA group's heads
  float* dq_dst = nullptr;  // where block t - 1's dQ partial goes
  // dQ partial = dS·K over both consumers' keys (splits 0 and 2) or this consumer's (split 1).
  auto issue_dq = [&](auto& acc_dq, int b) {
    if constexpr (Traits::kDqSplitKeys) {
      wgmma_issue<true>(mma_dq, tQrdS(_, _, _, consumer, b), tQrK(_, _, _, consumer), acc_dq);
    } else {
      CUTE_UNROLL
      for (int c = 0; c < Traits::kConsumers; ++c) {
        if (c == 0) wgmma_issue<true>(mma_dq, tQrdS(_, _, _, c, b), tQrK(_, _, _, c), acc_dq);
        else wgmma_issue<false>(mma_dq, tQrdS(_, _, _, c, b), tQrK(_, _, _, c), acc_dq);
      }
    }
  };
  // dQ partials go to dq_accum straight from registers (red_add_fragment; bwd_dq_convert.h
  // undoes the order): measured 0-6% faster than staging through shared memory for one bulk
  // reduce-add.
  //
  // This CTA's blocks, head by head: block i of the key block's range, of head g of the group.
  const int count = range.count();
  const int g0 = count > 0 ? tile.block_begin / count : 0;
  int i = tile.block_begin - g0 * count;
  int head = kv_head * args.heads_per_kv + g0;  // the query head of block i
  float* dq_accum_head = args.dq_accum + int64_t(pair_slot0 + g0) * args.seqlen_q_padded * kHeadDim;
  for (; t < blocks; ++t) {
    const int m = range.at(i);
    const int s = stage.index();
    const int buffer = t & 1;
    AccS acc_s, acc_dp;
    pipeline_q.consumer_wait(stage);
    wgmma_issue<true>(mma_sdp, tSrK, tSrQ(_, _, _, s), acc_s);
    pipeline_do.consumer_wait(stage);
    wgmma_issue<true>(mma_sdp, tSrV, tSrdO(_, _, _, s), acc_dp);

    // Per column (query row): lse in log2 units from the stage, loaded while Sᵀ still runs where
    // registers allow (shared-memory loads wait long behind the WGMMA operand traffic);
    // 128-row blocks read them where they are used.
    const float* lse_log2 = storage.lse_log2.data() + s * kBlockM + thread_col;
    float lse_cols[kPrefetchStats ? kCols : 1];
    if constexpr (kPrefetchStats) {
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) lse_cols[c] = lse_log2[get<1>(offsets_rc(0, c))];
    }
    const float slope = kScoreHook ? hook.alibi_slope(batch, head) : 0.f;  // loaded while Sᵀ runs
    warpgroup_wait<1>();  // Sᵀ
    Tensor s_rc = rowcol_view(acc_s);
    if constexpr (kScoreHook)
      hook.apply_transposed(s_rc, offsets_rc, key0 + thread_key, m * kBlockM + thread_col, mask.offset(), slope);
    if (range.needs_mask(m))  // warp-uniform: the bulk skips the mask
      mask.apply_transposed(s_rc, offsets_rc, key0 + thread_key, m * kBlockM + thread_col);
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const float lse = kPrefetchStats ? lse_cols[kPrefetchStats ? c : 0] : lse_log2[get<1>(offsets_rc(0, c))];
      CUTE_UNROLL
      for (int r = 0; r < size<0>(s_rc); ++r) s_rc(r, c) = fast_exp2(fmaf(s_rc(r, c), args.scale_log2, -lse));
    }
    // Dropout's keep bits of the block, while dPᵀ runs (its state read here, not held). Four
    // Philox groups at a time: all eight of hd 64's 128-row blocks at once spilled P's exp2s.
    const bool dropout = kScoreHook && args.dropout_threshold != 0;
    Dropout::Mask<kRows, kCols> keep;
    constexpr int kKeepGroupsAtOnce = 4;
    if constexpr (kScoreHook) {
      if (dropout)
        keep = Dropout::of(args).mask_transposed<kKeepGroupsAtOnce>(
            offsets_rc, key0 + thread_key, m * kBlockM + thread_col, batch * args.nheads + head);
    }
    // rowsum(dO∘O) per column, the same way.
    const float* row_dot = storage.row_dot.data() + s * kBlockM + thread_col;
    float dot_cols[kPrefetchStats ? kCols : 1];
    if constexpr (kPrefetchStats) {
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) dot_cols[c] = row_dot[get<1>(offsets_rc(0, c))];
    }
    // dS = P∘(dPᵀ − rowsum(dO∘O)) while P is still fp32, then dV += Pᵀ·dO (measured faster than
    // issuing dV first, and fewer live registers).
    warpgroup_wait<0>();  // dPᵀ
    Tensor dp_rc = rowcol_view(acc_dp);
    if constexpr (kScoreHook) {
      if (dropout) {  // the kept weights' dPᵀ, scaled; the dropped ones' 0
        CUTE_UNROLL
        for (int c = 0; c < kCols; ++c) {
          CUTE_UNROLL
          for (int r = 0; r < kRows; ++r) dp_rc(r, c) = keep.kept(r, c) ? dp_rc(r, c) * args.dropout_rescale : 0.f;
        }
      }
    }
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const float dot = kPrefetchStats ? dot_cols[kPrefetchStats ? c : 0] : row_dot[get<1>(offsets_rc(0, c))];
      CUTE_UNROLL
      for (int r = 0; r < size<0>(dp_rc); ++r) dp_rc(r, c) = s_rc(r, c) * (dp_rc(r, c) - dot);
    }
    if constexpr (kScoreHook) {
      if (hook.softcap()) {  // ALiBi's bias alone leaves dS as it is
        const float base = float(m * kBlockM + thread_col + mask.offset() - (key0 + thread_key));
        CUTE_UNROLL
        for (int c = 0; c < kCols; ++c) {
          const float lse = lse_log2[get<1>(offsets_rc(0, c))];
          CUTE_UNROLL
          for (int r = 0; r < size<0>(dp_rc); ++r)
            dp_rc(r, c) *= hook.grad_factor(s_rc(r, c), lse, 1.f / args.scale_log2,
                                            ScoreHook::alibi_bias(slope, base, offsets_rc, r, c, -1.f));
        }
      }
    }
    if constexpr (kScoreHook) {
      if (dropout) {  // dV takes the kept weights only (dS above took them all)
        CUTE_UNROLL
        for (int c = 0; c < kCols; ++c) {
          CUTE_UNROLL
          for (int r = 0; r < kRows; ++r) s_rc(r, c) = keep.kept(r, c) ? s_rc(r, c) : 0.f;
        }
      }
    }
    convert_fragment_into(acc_s, p_regs);
    constexpr bool kDvLast = Traits::kDvAfterDq;
    if constexpr (!kDvLast) wgmma_issue<false>(mma_dkv, tDrP, tDrdO(_, _, _, s), acc_dv);
    convert_fragment_into(acc_dp, ds_regs);

    // dS to shared memory for dQ (stmatrix, then fenced for the WGMMA's async proxy).
    if (kDeferDq && t >= 2) named_barrier_sync(ds_free(consumer, buffer), 256);
    copy(ds_copy, tDSrdS, tDSsdS(_, _, _, consumer, buffer));
    cutlass::arch::fence_view_async_shared();
    if constexpr (kDeferDq) named_barrier_arrive(ds_full(consumer, buffer), 256);
    else if constexpr (Traits::kDqSplitKeys) named_barrier_sync(consumer_barrier, 128);
    else named_barrier_sync(int(BwdBarrier::kDsReady), 128 * Traits::kConsumers);

    // dQ before dK, so that dQ's partial is added while dK still runs on the tensor cores.
    // Each branch waits for its own dQ: ptxas serializes the WGMMAs if an accumulator's
    // issue and wait sit on different paths.
    const bool dq_now = !kDeferDq || t >= 1;
    const int dq_buffer = kDeferDq ? buffer ^ 1 : buffer;
    float* block_dst = dq_accum_head + int64_t(m) * kBlockM * kHeadDim + dq_region * kDqElems + tid * 4;
    if (dq_now) {
      if constexpr (kDeferDq) named_barrier_sync(ds_full(other, dq_buffer), 256);
      Tensor acc_dq = partition_fragment_C(mma_dq, typename Traits::TileDq{});
      issue_dq(acc_dq, dq_buffer);
      wgmma_issue<false>(mma_dkv, tDrdS, tDrQ(_, _, _, s), acc_dk);
      if constexpr (kDvLast) {
        wgmma_issue<false>(mma_dkv, tDrP, tDrdO(_, _, _, s), acc_dv);
        warpgroup_wait<2>();  // dQ (dK and dV may still run)
      } else {
        warpgroup_wait<1>();  // dV and dQ (dK may still run)
      }
      if (kDeferDq && t + 1 < blocks) named_barrier_arrive(ds_free(other, dq_buffer), 256);
      if constexpr (!kDvLast) pipeline_do.consumer_release(stage);
      red_add_fragment(kDeferDq ? dq_dst : block_dst, acc_dq);
    } else {
      wgmma_issue<false>(mma_dkv, tDrdS, tDrQ(_, _, _, s), acc_dk);
      if constexpr (kDvLast) {
        wgmma_issue<false>(mma_dkv, tDrP, tDrdO(_, _, _, s), acc_dv);
      } else {
        warpgroup_wait<1>();  // dV
        pipeline_do.consumer_release(stage);
      }
    }
    dq_dst = block_dst;
    warpgroup_wait<0>();  // dK (and dV)
    if constexpr (kDvLast) pipeline_do.consumer_release(stage);
    pipeline_q.consumer_release(stage);
    ++stage;
    if (++i == count) i = 0, dq_accum_head += int64_t(args.seqlen_q_padded) * kHeadDim, ++head;
  }
  // The last block's dQ.
  if (kDeferDq && blocks > 0) {
    const int dq_buffer = (blocks - 1) & 1;
    named_barrier_sync(ds_full(other, dq_buffer), 256);
    Tensor acc_dq = partition_fragment_C(mma_dq, typename Traits::TileDq{});
    issue_dq(acc_dq, dq_buffer);
    warpgroup_wait<0>();
    red_add_fragment(dq_dst, acc_dq);
  }

  // Epilogue: dK (scaled) and dV into this consumer's K and V tiles, then TMA stores (clipped
  // at seqlen_k; row stores past a packed sequence's keys, bwd_tma.h). Every consumer's dQ
  // GEMMs read all of K: wait for both first.
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= args.softmax_scale;
  if constexpr (kScoreHook) {  // dropout's 1 / (1 - p) (1 without dropout), before any split sums
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dv); ++i) acc_dv(i) *= args.dropout_rescale;
  }
  bool store = true;
  const BwdTile end_tile = bwd_tile(params, cta_index_again());
  if (end_tile.split >= 0) {
    // A part of a split tile: only the part that counts itself last stores.
    store = add_split_sums(params, storage, end_tile.split, consumer, tid, acc_dk, acc_dv);
  } else {
    named_barrier_sync(int(BwdBarrier::kDsReady), 128 * Traits::kConsumers);
  }
  if (store) {
    Tensor dk = convert_fragment<ElementGrad>(acc_dk);
    Tensor dv = convert_fragment<ElementGrad>(acc_dv);
    auto dkv_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomDkv{}, mma_dkv);
    auto dkv_thr_copy = dkv_copy.get_thread_slice(tid);
    copy(dkv_copy, dkv_thr_copy.retile_S(dk), dkv_thr_copy.partition_D(sK(_, _, consumer)));
    copy(dkv_copy, dkv_thr_copy.retile_S(dv), dkv_thr_copy.partition_D(sV(_, _, consumer)));
    cutlass::arch::fence_view_async_shared();
    named_barrier_sync(consumer_barrier, 128);
    store_dkv_tile<Traits>(params, sK(_, _, consumer), sV(_, _, consumer),
                           end_tile.n_block * Traits::kConsumers + consumer, end_tile.kv_head, end_tile.batch, tid, 128);
  }
  // Both consumers' dQ adds precede the kDsReady barrier above: count this CTA as done with
  // them (the fence waits here, at the CTA's end, in a warp that does not store dK and dV).
  if (consumer == 1 && tid == 32 && args.dq_ready != nullptr) count_release(args.dq_ready + end_tile.pair_slot);
}

}  // namespace flashcute::hopper
