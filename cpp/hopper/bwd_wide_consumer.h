// Consumer warpgroups of the Hopper-path backward for wide head dims (bwd_wide_traits.h): the
// two consumers split each block's 64 query rows for Sᵀ and dPᵀ, exchange Pᵀ and dSᵀ through
// shared memory, and split the head dim for dV, dK and dQ.
//
// Order inside a block: Sᵀ and dPᵀ issued together; P, then dS, to shared memory; one barrier
// for both consumers; then dQ, dV, dK issued back to back, dQ's partial added to dq_accum
// while dV and dK run. Their completion is only awaited behind the next block's Sᵀ (the
// tensor cores run them in order anyway), which is where the Q and dO stages are released.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "fragment_views.h"
#include "hopper/bwd_consumer.h"  // red_add_f32x4
#include "hopper/bwd_params.h"
#include "hopper/named_barriers.h"
#include "hopper/wgmma.h"
#include "mask.h"
#include "online_softmax.h"  // fast_exp2

namespace flashcute::hopper {

template <class Traits>
CUTE_DEVICE void consume_bwd_wide(BwdParams<Traits> const& params, typename Traits::SharedStorage& storage,
                                  typename Traits::PipelineQ& pipeline_q, typename Traits::PipelineQ& pipeline_do,
                                  int consumer, int n_block, int kv_head, int batch) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr int kRows = Traits::kRowsPerConsumer;
  constexpr int kCols = Traits::kColsPerConsumer;
  const BwdKernelParams& args = params.args;
  const int tid = threadIdx.x % 128;

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
  Tensor sdS = make_tensor(make_smem_ptr(storage.ds.data()), typename Traits::SmemLayoutPds{});
  Tensor sPt = make_tensor(make_smem_ptr(storage.p.data()), typename Traits::SmemLayoutPdst{});
  Tensor sdSt = make_tensor(make_smem_ptr(storage.ds.data()), typename Traits::SmemLayoutPdst{});

  // Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ: all 64 keys against this consumer's 32 query rows.
  const auto my_rows = Shape<Int<kRows>, Int<kHeadDim>, Int<kStages>>{};
  Tensor tSrK = thr_sdp.partition_fragment_A(sK(_, _, _0{}));
  Tensor tSrV = thr_sdp.partition_fragment_A(sV(_, _, _0{}));
  Tensor tSrQ = thr_sdp.partition_fragment_B(local_tile(sQ, my_rows, make_coord(consumer, _0{}, _0{})));
  Tensor tSrdO = thr_sdp.partition_fragment_B(local_tile(sdO, my_rows, make_coord(consumer, _0{}, _0{})));
  // dV += Pᵀ·dO and dK += dSᵀ·Q on this consumer's columns: (MMA, M, K, buffer) and
  // (MMA, N, K, stage).
  const auto my_cols = Shape<Int<kCols>, Int<kBlockM>, Int<kStages>>{};
  Tensor tDrP = thr_dkv.partition_fragment_A(sPt);
  Tensor tDrdS = thr_dkv.partition_fragment_A(sdSt);
  Tensor tDrdO = thr_dkv.partition_fragment_B(local_tile(sdOt, my_cols, make_coord(consumer, _0{}, _0{})));
  Tensor tDrQ = thr_dkv.partition_fragment_B(local_tile(sQt, my_cols, make_coord(consumer, _0{}, _0{})));
  // dQ = dS·K on this consumer's columns of K.
  Tensor tQrdS = thr_dq.partition_fragment_A(sdS);  // (MMA, M, K, buffer)
  Tensor tQrK = thr_dq.partition_fragment_B(
      local_tile(sKt, Shape<Int<kCols>, Int<kBlockN>, _1>{}, make_coord(consumer, _0{}, _0{})));

  Tensor acc_dk = partition_fragment_C(mma_dkv, typename Traits::TileDkv{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, typename Traits::TileDkv{});
  clear(acc_dk);
  clear(acc_dv);
  using AccS = decltype(partition_fragment_C(mma_sdp, typename Traits::TileSt{}));
  Tensor p_regs = make_tensor<Element>(make_layout(shape(AccS{})));
  Tensor ds_regs = make_tensor<Element>(make_layout(shape(AccS{})));

  // Pᵀ and dSᵀ registers -> this consumer's 32 columns of the (keys, rows) tiles, by stmatrix.
  auto pds_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomStore{}, mma_sdp);
  auto pds_thr_copy = pds_copy.get_thread_slice(tid);
  const auto my_block_cols = Shape<Int<kBlockN>, Int<kRows>, _2>{};
  Tensor tPsP = pds_thr_copy.partition_D(local_tile(sPt, my_block_cols, make_coord(_0{}, consumer, _0{})));
  Tensor tPsdS = pds_thr_copy.partition_D(local_tile(sdSt, my_block_cols, make_coord(_0{}, consumer, _0{})));
  Tensor tPrP = pds_thr_copy.retile_S(p_regs);
  Tensor tPrdS = pds_thr_copy.retile_S(ds_regs);

  // Score coordinates: rows are keys, columns this consumer's query rows (see mask.h).
  Tensor cS = make_identity_tensor(typename Traits::TileSt{});
  Tensor tScS0 = mma_sdp.get_thread_slice(0).partition_C(cS);
  Tensor offsets_rc = make_tensor(tScS0.data(), rowcol_layout(tScS0.layout()));
  constexpr int kScoreCols = decltype(size<1>(offsets_rc))::value;
  const int thread_key = get<0>(thr_sdp.partition_C(cS)(0));
  const int thread_col = consumer * kRows + get<1>(thr_sdp.partition_C(cS)(0));  // in the block
  const BlockMask mask{args.seqlen_k, args.seqlen_k - args.seqlen_q, args.causal};
  const int key0 = n_block * kBlockN;
  const QueryBlockRange range =
      query_block_range<kBlockM, kBlockN>(key0, args.seqlen_q, args.seqlen_k, args.causal);
  const int pair_slot0 = (batch * args.nheads_kv + kv_head - params.pair_begin) * args.heads_per_kv;

  cutlass::PipelineState<kStages> q_state, do_state;       // next stages to read
  cutlass::PipelineState<kStages> q_release, do_release;  // read by GEMMs not yet awaited
  bool release_pending = false;
  storage.kv_full.wait(0);
  int buffer = 0;
  for (int g = 0; g < args.heads_per_kv; ++g) {
    float* dq_accum_head = args.dq_accum + int64_t(pair_slot0 + g) * args.seqlen_q_padded * kHeadDim;
    for (int m = range.begin; m < range.end; ++m) {
      const int q_stage = q_state.index();
      const int do_stage = do_state.index();
      AccS acc_s, acc_dp;
      pipeline_q.consumer_wait(q_state);
      wgmma_issue<true>(mma_sdp, tSrK, tSrQ(_, _, _, q_stage), acc_s);
      pipeline_do.consumer_wait(do_state);
      wgmma_issue<true>(mma_sdp, tSrV, tSrdO(_, _, _, do_stage), acc_dp);

      const float* lse_log2 = storage.lse_log2.data() + q_stage * kBlockM + thread_col;
      float lse_cols[kScoreCols];
      CUTE_UNROLL
      for (int c = 0; c < kScoreCols; ++c) lse_cols[c] = lse_log2[get<1>(offsets_rc(0, c))];
      warpgroup_wait<1>();  // Sᵀ, and the previous block's dV and dK
      if (release_pending) {
        pipeline_q.consumer_release(q_release);
        pipeline_do.consumer_release(do_release);
        ++q_release;
        ++do_release;
      }
      Tensor s_rc = rowcol_view(acc_s);
      if (m < range.masked_end)  // warp-uniform: the bulk skips the mask
        apply_mask_transposed(mask, s_rc, offsets_rc, key0 + thread_key, m * kBlockM + thread_col);
      CUTE_UNROLL
      for (int c = 0; c < kScoreCols; ++c) {
        CUTE_UNROLL
        for (int r = 0; r < size<0>(s_rc); ++r) s_rc(r, c) = fast_exp2(fmaf(s_rc(r, c), args.scale_log2, -lse_cols[c]));
      }
      convert_fragment_into(acc_s, p_regs);
      copy(pds_copy, tPrP, tPsP(_, _, _, buffer));

      const float* row_dot = storage.row_dot.data() + do_stage * kBlockM + thread_col;
      float dot_cols[kScoreCols];
      CUTE_UNROLL
      for (int c = 0; c < kScoreCols; ++c) dot_cols[c] = row_dot[get<1>(offsets_rc(0, c))];
      warpgroup_wait<0>();  // dPᵀ
      Tensor dp_rc = rowcol_view(acc_dp);
      CUTE_UNROLL
      for (int c = 0; c < kScoreCols; ++c) {
        CUTE_UNROLL
        for (int r = 0; r < size<0>(dp_rc); ++r) dp_rc(r, c) = s_rc(r, c) * (dp_rc(r, c) - dot_cols[c]);
      }
      convert_fragment_into(acc_dp, ds_regs);
      copy(pds_copy, tPrdS, tPsdS(_, _, _, buffer));
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes visible to WGMMA
      named_barrier_sync(int(BwdBarrier::kDsReady), 128 * Traits::kConsumers);

      Tensor acc_dq = partition_fragment_C(mma_dq, typename Traits::TileDq{});
      wgmma_issue<true>(mma_dq, tQrdS(_, _, _, buffer), tQrK(_, _, _, _0{}), acc_dq);
      wgmma_issue<false>(mma_dkv, tDrP(_, _, _, buffer), tDrdO(_, _, _, do_stage), acc_dv);
      wgmma_issue<false>(mma_dkv, tDrdS(_, _, _, buffer), tDrQ(_, _, _, q_stage), acc_dk);
      warpgroup_wait<2>();  // dQ
      {
        static_assert(size(decltype(acc_dq){}) % 4 == 0);
        float* dst = dq_accum_head + int64_t(m) * kBlockM * kHeadDim + consumer * Traits::kDqElems + tid * 4;
        CUTE_UNROLL
        for (int i = 0; i < size(acc_dq); i += 4)
          red_add_f32x4(dst + i * 128, acc_dq(i), acc_dq(i + 1), acc_dq(i + 2), acc_dq(i + 3));
      }
      release_pending = true;
      ++q_state;
      ++do_state;
      buffer ^= 1;
    }
  }
  warpgroup_wait<0>();
  if (release_pending) {
    pipeline_q.consumer_release(q_release);
    pipeline_do.consumer_release(do_release);
  }

  // Epilogue: this consumer's columns of dK (scaled) and dV into K's and V's tiles, then one
  // thread stores both whole tiles with TMA (clipped at seqlen_k).
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= args.softmax_scale;
  Tensor dk = convert_fragment<Element>(acc_dk);
  Tensor dv = convert_fragment<Element>(acc_dv);
  named_barrier_sync(int(BwdBarrier::kDsReady), 128 * Traits::kConsumers);  // no GEMM reads K or V
  auto dkv_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomStore{}, mma_dkv);
  auto dkv_thr_copy = dkv_copy.get_thread_slice(tid);
  const auto tile_dkv = typename Traits::TileDkv{};
  copy(dkv_copy, dkv_thr_copy.retile_S(dk),
       dkv_thr_copy.partition_D(local_tile(sK(_, _, _0{}), tile_dkv, make_coord(_0{}, consumer))));
  copy(dkv_copy, dkv_thr_copy.retile_S(dv),
       dkv_thr_copy.partition_D(local_tile(sV(_, _, _0{}), tile_dkv, make_coord(_0{}, consumer))));
  cutlass::arch::fence_view_async_shared();
  named_barrier_sync(int(BwdBarrier::kDsReady), 128 * Traits::kConsumers);
  if (consumer == 0 && tid == 0) {
    store_dkv_tile<Traits>(params, sK(_, _, _0{}), sV(_, _, _0{}), n_block, kv_head, batch);
  }
}

}  // namespace flashcute::hopper
