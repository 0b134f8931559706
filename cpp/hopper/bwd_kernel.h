// Hopper-path attention backward kernel (sm90a): dK and dV of one key block, dQ added into an
// fp32 buffer. One CTA per (key block, batch, kv head) of the current dq_accum chunk, or per
// part of one where the last wave is split (bwd_tail_split.h).
//
// Warpgroup 0 is the producer (registers lowered, one thread issues the loads); warpgroups 1
// and 2 are the consumers, 64 keys each, or (hd 256) half of the head dim each
// (and half of the keys for S and dP).
// Q and dO flow through separate mbarrier pipelines.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "hopper/bwd_consumer.h"
#include "hopper/bwd_params.h"
#include "hopper/bwd_producer.h"
#include "hopper/bwd_wide_consumer.h"

namespace flashcute::hopper {

// A Q or dO pipeline: each stage is one TMA tile plus the block's lse (row_dot) values.
template <class Pipeline, class Traits>
CUTE_DEVICE Pipeline make_bwd_pipeline(typename Pipeline::SharedStorage& storage, int warp_group, bool producer_thread) {
  typename Pipeline::Params params;
  params.transaction_bytes = Traits::kStageBytes;
  params.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  params.is_leader = producer_thread;
  params.num_consumers = 128 * Traits::kConsumers;
  return Pipeline(storage, params, cute::Shape<cute::_1, cute::_1, cute::_1>{});
}

// kScoreHook: the score hook (softcap, ALiBi; score_hook.h) and dropout (dropout.h) compiled
// in, one variant for all (a runtime branch cost 1.5-4 % of the dense backward at hd 128,
// short sequences; H200, benchmarks/results/README.md).
template <class Traits, bool kDeferDq = false, bool kScoreHook = false>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_kernel(__grid_constant__ const BwdParams<Traits> params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using PipelineQ = typename Traits::PipelineQ;
  using PipelineDo = typename Traits::PipelineDo;
  extern __shared__ __align__(1024) char smem_raw[];
  auto& storage = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);

  // The dQ conversion is launched as this grid's programmatic dependent: once every CTA has
  // started, it may start on the SMs the last wave leaves idle, converting the query blocks of
  // each (batch, kv head) pair as soon as dq_ready has counted all of the pair's CTAs.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  const int warp_group = __shfl_sync(0xffffffff, threadIdx.x / 128, 0);
  const bool producer_thread = threadIdx.x == 0;
  const BwdTile tile = bwd_tile(params, blockIdx.x);

  if (producer_thread) {
    prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_do.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    storage.kv_full.init(1);
  }
  PipelineQ pipeline_q = make_bwd_pipeline<PipelineQ, Traits>(storage.pipeline_q, warp_group, producer_thread);
  PipelineDo pipeline_do = make_bwd_pipeline<PipelineDo, Traits>(storage.pipeline_do, warp_group, producer_thread);
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (producer_thread) produce_bwd<Traits>(params, storage, pipeline_q, pipeline_do, tile);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    if constexpr (Traits::kSplitsHeadDim)
      consume_bwd_wide<Traits, kScoreHook>(params, storage, pipeline_q, pipeline_do, warp_group - 1, tile);
    else
      consume_bwd<Traits, kDeferDq, kScoreHook>(params, storage, pipeline_q, pipeline_do, warp_group - 1, tile);
  }
#endif
}

}  // namespace flashcute::hopper
