// Consumer warpgroups of the Hopper-path backward that splits the head dim (bwd_wide_traits.h,
// hd 256): the two consumers split each block's keys for S and dP, exchange P and dS
// through shared memory, and split the head dim for dV, dK and dQ.
//
// Order inside a block: S and dP issued together; P, then dS, to shared memory; one barrier
// for both consumers; then dQ (first chunk), dV, dQ (second chunk, hd 256 only), dK, each dQ
// chunk added to dq_accum while the next GEMM runs, so the tensor cores always have work queued. dO is
// released as soon as dV has read it (it may have a single stage); Q once dK is done, which
// is only awaited behind the next block's S.
// Dropout (dropout.h; in the score-hook variant): P∘Z goes to shared memory for dV, dS =
// P∘(Z·dP/(1 − p) − rowsum(dO∘O)), and dV is scaled by 1 / (1 − p) at the end.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "dropout.h"
#include "fragment_views.h"
#include "hopper/bwd_params.h"
#include "hopper/bwd_split_sums.h"
#include "dq_reduce.h"
#include "hopper/named_barriers.h"
#include "hopper/wgmma.h"
#include "mask.h"
#include "online_softmax.h"  // fast_exp2
#include "score_hook.h"

namespace flashcute::hopper {

template <class Traits, bool kScoreHook>
CUTE_DEVICE void consume_bwd_wide(BwdParams<Traits> const& params, typename Traits::SharedStorage& storage,
                                  typename Traits::PipelineQ& pipeline_q, typename Traits::PipelineDo& pipeline_do,
                                  int consumer, BwdTile const& tile) {
  using namespace cute;
  const int n_block = tile.n_block, kv_head = tile.kv_head, batch = tile.batch;
  using ElementP = typename Traits::ElementP;
  using ElementGrad = typename Traits::ElementGrad;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr int kDoStages = Traits::kDoStages;
  constexpr int kKeys = Traits::kKeysPerConsumer;
  constexpr int kCols = Traits::kColsPerConsumer;
  constexpr int kDqChunks = Traits::kDqChunks;
  const BwdKernelParams& args = params.args;
  const int tid = threadIdx.x % 128;

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmaDkv mma_dkv;
  typename Traits::TiledMmaDq mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);

  Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(storage.dout.data()), typename Traits::SmemLayoutDo{});
  Tensor sQt = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQt{});
  Tensor sdOt = make_tensor(make_smem_ptr(storage.dout.data()), typename Traits::SmemLayoutDot{});
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutKV{});
  Tensor sKt = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutKt{});
  Tensor sP = make_tensor(make_smem_ptr(storage.p.data()), typename Traits::SmemLayoutPds{});
  Tensor sdS = make_tensor(make_smem_ptr(storage.ds.data()), typename Traits::SmemLayoutPds{});
  Tensor sPt = make_tensor(make_smem_ptr(storage.p.data()), typename Traits::SmemLayoutPdst{});
  Tensor sdSt = make_tensor(make_smem_ptr(storage.ds.data()), typename Traits::SmemLayoutPdst{});

  // S = Q·Kᵀ, dP = dO·Vᵀ: all 64 rows against this consumer's keys. (MMA, M, K, stage) and
  // (MMA, N, K).
  const auto my_keys = Shape<Int<kKeys>, Int<kHeadDim>>{};
  Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);
  Tensor tSrdO = thr_sdp.partition_fragment_A(sdO);
  Tensor tSrK = thr_sdp.partition_fragment_B(local_tile(sK(_, _, _0{}), my_keys, make_coord(consumer, _0{})));
  Tensor tSrV = thr_sdp.partition_fragment_B(local_tile(sV(_, _, _0{}), my_keys, make_coord(consumer, _0{})));
  // dVᵀ += dOᵀ·P and dKᵀ += Qᵀ·dS on this consumer's head-dim columns, all keys.
  Tensor tDrdOt = thr_dkv.partition_fragment_A(
      local_tile(sdOt, Shape<Int<kCols>, Int<kBlockM>, Int<kDoStages>>{}, make_coord(consumer, _0{}, _0{})));
  Tensor tDrQt = thr_dkv.partition_fragment_A(
      local_tile(sQt, Shape<Int<kCols>, Int<kBlockM>, Int<kStages>>{}, make_coord(consumer, _0{}, _0{})));
  Tensor tDrP = thr_dkv.partition_fragment_B(sPt);  // (MMA, N, K, buffer)
  Tensor tDrdS = thr_dkv.partition_fragment_B(sdSt);
  // dQ = dS·K on this consumer's columns, one 64-column chunk per GEMM.
  Tensor tQrdS = thr_dq.partition_fragment_A(sdS);  // (MMA, M, K, buffer)
  const auto dq_chunk = Shape<Int<Traits::kDqCols>, Int<kBlockN>>{};
  Tensor tQrK0 = thr_dq.partition_fragment_B(
      local_tile(sKt(_, _, _0{}), dq_chunk, make_coord(consumer * kDqChunks, _0{})));
  Tensor tQrK1 = thr_dq.partition_fragment_B(
      local_tile(sKt(_, _, _0{}), dq_chunk, make_coord(consumer * kDqChunks + kDqChunks - 1, _0{})));

  Tensor acc_dk = partition_fragment_C(mma_dkv, typename Traits::TileDkvT{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, typename Traits::TileDkvT{});
  clear(acc_dk);
  clear(acc_dv);
  using AccS = decltype(partition_fragment_C(mma_sdp, typename Traits::TileS{}));
  using AccDq = decltype(partition_fragment_C(mma_dq, typename Traits::TileDq{}));
  Tensor p_regs = make_tensor<ElementP>(make_layout(shape(AccS{})));
  Tensor ds_regs = make_tensor<ElementP>(make_layout(shape(AccS{})));

  // P and dS registers -> this consumer's keys of the (rows, keys) tiles, by stmatrix.
  auto pds_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomPds{}, mma_sdp);
  auto pds_thr_copy = pds_copy.get_thread_slice(tid);
  const auto my_block_keys = Shape<Int<kBlockM>, Int<kKeys>, _2>{};
  Tensor tPsP = pds_thr_copy.partition_D(local_tile(sP, my_block_keys, make_coord(_0{}, consumer, _0{})));
  Tensor tPsdS = pds_thr_copy.partition_D(local_tile(sdS, my_block_keys, make_coord(_0{}, consumer, _0{})));
  Tensor tPrP = pds_thr_copy.retile_S(p_regs);
  Tensor tPrdS = pds_thr_copy.retile_S(ds_regs);

  // Score coordinates: rows are query rows of the block, columns this consumer's keys.
  Tensor cS = make_identity_tensor(typename Traits::TileS{});
  Tensor tScS0 = mma_sdp.get_thread_slice(0).partition_C(cS);
  Tensor offsets_rc = make_tensor(tScS0.data(), rowcol_layout(tScS0.layout()));
  constexpr int kScoreRows = decltype(size<0>(offsets_rc))::value;
  const int thread_row = get<0>(thr_sdp.partition_C(cS)(0));
  const int thread_key = consumer * kKeys + get<1>(thr_sdp.partition_C(cS)(0));  // in the block
  const SeqView view = SeqView::of(args, batch);  // the pair's sequence (seq_view.h)
  const MaskPolicy mask = view.mask(args);
  const ScoreHook hook = ScoreHook::of(args);
  const int key0 = n_block * kBlockN;
  const QueryBlockRange range = query_block_range<kBlockM, kBlockN>(mask, key0);
  const int pair_slot0 = (batch * args.nheads_kv + kv_head - params.pair_begin) * args.heads_per_kv;

  cutlass::PipelineState<kStages> q_state, q_release;  // next stage to read; read by dK not yet awaited
  cutlass::PipelineState<kDoStages> do_state;
  bool release_pending = false;
  storage.kv_full.wait(0);
  // Variable-length batches: K and V rows past the sequence's used keys may hold anything, NaN
  // included, and 0 · NaN would reach dS and dQ (bwd_consumer.h): zeroed by both consumers.
  if (!SeqView::fixed(args) && key0 + kBlockN > view.seqlen_k) {
    const int thread = consumer * 128 + tid;
    zero_tile_rows(sK(_, _, _0{}), view.seqlen_k - key0, thread, 128 * Traits::kConsumers);
    zero_tile_rows(sV(_, _, _0{}), view.seqlen_k - key0, thread, 128 * Traits::kConsumers);
    cutlass::arch::fence_view_async_shared();
    named_barrier_sync(int(BwdBarrier::kDsReady), 128 * Traits::kConsumers);
  }
  int buffer = 0;
  // This CTA's blocks, head by head: block i of the key block's range, of head g of the group.
  const int count = range.count();
  const int g0 = count > 0 ? tile.block_begin / count : 0;
  int i = tile.block_begin - g0 * count;
  int head = kv_head * args.heads_per_kv + g0;  // the query head of block i
  float* dq_accum_head = args.dq_accum + int64_t(pair_slot0 + g0) * args.seqlen_q_padded * kHeadDim;
  for (int t = tile.block_begin; t < tile.block_end; ++t) {
    const int m = range.at(i);
    const int q_stage = q_state.index();
    const int do_stage = do_state.index();
    AccS acc_s, acc_dp;
    pipeline_q.consumer_wait(q_state);
    wgmma_issue<true>(mma_sdp, tSrQ(_, _, _, q_stage), tSrK, acc_s);
    pipeline_do.consumer_wait(do_state);
    wgmma_issue<true>(mma_sdp, tSrdO(_, _, _, do_stage), tSrV, acc_dp);

    const float* lse_log2 = storage.lse_log2.data() + q_stage * kBlockM + thread_row;
    float lse_rows[kScoreRows];
    CUTE_UNROLL
    for (int r = 0; r < kScoreRows; ++r) lse_rows[r] = lse_log2[get<0>(offsets_rc(r, 0))];
    const float slope = kScoreHook ? hook.alibi_slope(batch, head) : 0.f;  // loaded while S runs
    warpgroup_wait<1>();  // S, and the previous block's dK
    if (release_pending) {
      pipeline_q.consumer_release(q_release);
      ++q_release;
    }
    Tensor s_rc = rowcol_view(acc_s);
    if constexpr (kScoreHook)
      hook.apply(s_rc, offsets_rc, m * kBlockM + thread_row, key0 + thread_key, mask.offset(), slope);
    if (range.needs_mask(m))  // warp-uniform: the bulk skips the mask
      mask.apply(s_rc, offsets_rc, m * kBlockM + thread_row, key0 + thread_key);
    CUTE_UNROLL
    for (int r = 0; r < kScoreRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s_rc); ++c) s_rc(r, c) = fast_exp2(fmaf(s_rc(r, c), args.scale_log2, -lse_rows[r]));
    }
    convert_fragment_into(acc_s, p_regs);
    // Dropout: the block's keep bits (its state read here, not held); dV takes the kept weights
    // only, dS below all of them. The second consumer's keys start 8 past a multiple of 16.
    const bool dropout = kScoreHook && args.dropout_threshold != 0;
    Dropout::Mask<kScoreRows, decltype(size<1>(s_rc))::value> keep;
    if constexpr (kScoreHook) {
      if (dropout) {
        keep = Dropout::of(args).mask_by_key_groups(offsets_rc, m * kBlockM + thread_row, key0 + thread_key,
                                                    batch * args.nheads + head);
        Tensor p_rc = rowcol_view(p_regs);
        CUTE_UNROLL
        for (int r = 0; r < kScoreRows; ++r) {
          CUTE_UNROLL
          for (int c = 0; c < size<1>(p_rc); ++c) {
            if (!keep.kept(r, c)) p_rc(r, c) = ElementP(0.f);
          }
        }
      }
    }
    copy(pds_copy, tPrP, tPsP(_, _, _, buffer));

    const float* row_dot = storage.row_dot.data() + do_stage * kBlockM + thread_row;
    float dot_rows[kScoreRows];
    CUTE_UNROLL
    for (int r = 0; r < kScoreRows; ++r) dot_rows[r] = row_dot[get<0>(offsets_rc(r, 0))];
    warpgroup_wait<0>();  // dP
    Tensor dp_rc = rowcol_view(acc_dp);
    if constexpr (kScoreHook) {
      if (dropout) {  // the kept weights' dP, scaled; the dropped ones' 0
        CUTE_UNROLL
        for (int r = 0; r < kScoreRows; ++r) {
          CUTE_UNROLL
          for (int c = 0; c < size<1>(dp_rc); ++c) dp_rc(r, c) = keep.kept(r, c) ? dp_rc(r, c) * args.dropout_rescale : 0.f;
        }
      }
    }
    CUTE_UNROLL
    for (int r = 0; r < kScoreRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(dp_rc); ++c) dp_rc(r, c) = s_rc(r, c) * (dp_rc(r, c) - dot_rows[r]);
    }
    if constexpr (kScoreHook) {
      if (hook.softcap()) {  // ALiBi's bias alone leaves dS as it is
        const float base = float(m * kBlockM + thread_row + mask.offset() - (key0 + thread_key));
        CUTE_UNROLL
        for (int r = 0; r < kScoreRows; ++r) {
          const float lse = lse_log2[get<0>(offsets_rc(r, 0))];
          CUTE_UNROLL
          for (int c = 0; c < size<1>(dp_rc); ++c)
            dp_rc(r, c) *= hook.grad_factor(s_rc(r, c), lse, 1.f / args.scale_log2,
                                            ScoreHook::alibi_bias(slope, base, offsets_rc, r, c));
        }
      }
    }
    convert_fragment_into(acc_dp, ds_regs);
    copy(pds_copy, tPrdS, tPsdS(_, _, _, buffer));
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes visible to WGMMA
    named_barrier_sync(int(BwdBarrier::kDsReady), 128 * Traits::kConsumers);

    // dQ chunk j's partial -> dq_accum region (consumer, j), in register order.
    auto reduce_dq = [&](AccDq const& acc_dq, int j) {
      red_add_fragment(dq_accum_head + int64_t(m) * kBlockM * kHeadDim +
                           (consumer * kDqChunks + j) * Traits::kDqElems + tid * 4,
                       acc_dq);
    };
    // dQ chunks, dV, dK, interleaved so that each chunk's reduction overlaps the next GEMM
    // and dO is released as early as possible.
    static_assert(kDqChunks == 1 || kDqChunks == 2);
    AccDq acc_dq;
    wgmma_issue<true>(mma_dq, tQrdS(_, _, _, buffer), tQrK0, acc_dq);
    wgmma_issue<false>(mma_dkv, tDrdOt(_, _, _, do_stage), tDrP(_, _, _, buffer), acc_dv);
    warpgroup_wait<1>();  // dQ chunk 0
    reduce_dq(acc_dq, 0);
    if constexpr (kDqChunks == 2) {
      wgmma_issue<true>(mma_dq, tQrdS(_, _, _, buffer), tQrK1, acc_dq);
      warpgroup_wait<1>();  // dV: dO may be refilled
      pipeline_do.consumer_release(do_state);
      wgmma_issue<false>(mma_dkv, tDrQt(_, _, _, q_stage), tDrdS(_, _, _, buffer), acc_dk);
      warpgroup_wait<1>();  // dQ chunk 1
      reduce_dq(acc_dq, 1);
    } else {
      wgmma_issue<false>(mma_dkv, tDrQt(_, _, _, q_stage), tDrdS(_, _, _, buffer), acc_dk);
      warpgroup_wait<1>();  // dV
      pipeline_do.consumer_release(do_state);
    }
    q_release = q_state;
    release_pending = true;
    ++q_state;
    ++do_state;
    buffer ^= 1;
    if (++i == count) i = 0, dq_accum_head += int64_t(args.seqlen_q_padded) * kHeadDim, ++head;
  }
  warpgroup_wait<0>();
  if (release_pending) pipeline_q.consumer_release(q_release);

  // Epilogue: this consumer's columns of dK (scaled) and dV, transposed into K's and V's
  // (keys, hd) tiles, then one thread stores both whole tiles with TMA (clipped at seqlen_k;
  // row stores past a packed sequence's keys, bwd_tma.h).
  CUTE_UNROLL
  for (int e = 0; e < size(acc_dk); ++e) acc_dk(e) *= args.softmax_scale;
  if constexpr (kScoreHook) {  // dropout's 1 / (1 - p) (1 without dropout), before any split sums
    CUTE_UNROLL
    for (int e = 0; e < size(acc_dv); ++e) acc_dv(e) *= args.dropout_rescale;
  }
  bool store = true;
  const BwdTile end_tile = bwd_tile(params, cta_index_again());
  if (end_tile.split >= 0) {
    // A part of a split tile: only the part that counts itself last stores.
    store = add_split_sums(params, storage, end_tile.split, consumer, tid, acc_dk, acc_dv);
  } else {
    named_barrier_sync(int(BwdBarrier::kDsReady), 128 * Traits::kConsumers);  // no GEMM reads K or V
  }
  if (store) {
    Tensor dk = convert_fragment<ElementGrad>(acc_dk);
    Tensor dv = convert_fragment<ElementGrad>(acc_dv);
    auto dkv_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomDkvT{}, mma_dkv);
    auto dkv_thr_copy = dkv_copy.get_thread_slice(tid);
    const auto tile_dkv = typename Traits::TileDkvT{};
    Tensor sVt = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutKt{});
    copy(dkv_copy, dkv_thr_copy.retile_S(dk),
         dkv_thr_copy.partition_D(local_tile(sKt(_, _, _0{}), tile_dkv, make_coord(consumer, _0{}))));
    copy(dkv_copy, dkv_thr_copy.retile_S(dv),
         dkv_thr_copy.partition_D(local_tile(sVt(_, _, _0{}), tile_dkv, make_coord(consumer, _0{}))));
    cutlass::arch::fence_view_async_shared();
    named_barrier_sync(int(BwdBarrier::kDsReady), 128 * Traits::kConsumers);
    store_dkv_tile<Traits>(params, sK(_, _, _0{}), sV(_, _, _0{}), end_tile.n_block, end_tile.kv_head,
                           end_tile.batch, consumer * 128 + tid, 128 * Traits::kConsumers);
  }
  // Both consumers' dQ adds precede the barriers above: count this CTA as done with them (the
  // fence waits here, at the CTA's end, while the other consumer's thread stores dK and dV).
  if (consumer == 1 && tid == 0 && args.dq_ready != nullptr) count_release(args.dq_ready + end_tile.pair_slot);
}

}  // namespace flashcute::hopper
