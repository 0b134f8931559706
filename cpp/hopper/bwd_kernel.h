// Hopper-path attention backward kernel (sm90a): dK and dV of one key block, dQ added into an
// fp32 buffer. One CTA per (key block, batch, kv head) of the current dq_accum chunk.
//
// Warpgroup 0 is the producer (registers lowered, one thread issues the loads); warpgroups 1
// and 2 are the consumers, 64 keys each, or for wide head dims half of the head dim each.
// Q and dO flow through separate mbarrier pipelines.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "hopper/bwd_consumer.h"
#include "hopper/bwd_params.h"
#include "hopper/bwd_producer.h"
#include "hopper/bwd_wide_consumer.h"

namespace flashcute::hopper {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    bwd_kernel(__grid_constant__ const BwdParams<Traits> params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using PipelineQ = typename Traits::PipelineQ;
  extern __shared__ __align__(1024) char smem_raw[];
  auto& storage = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);

  const int warp_group = __shfl_sync(0xffffffff, threadIdx.x / 128, 0);
  const bool producer_thread = threadIdx.x == 0;
  const int n_block = blockIdx.x;  // causal: low key blocks meet the most rows and start first
  const int pair = params.pair_begin + blockIdx.y;
  const int batch = pair / params.args.nheads_kv;
  const int kv_head = pair % params.args.nheads_kv;

  if (producer_thread) {
    prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_do.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    storage.kv_full.init(1);
  }
  typename PipelineQ::Params pipeline_params;
  pipeline_params.transaction_bytes = Traits::kStageBytes;
  pipeline_params.role = warp_group == 0 ? PipelineQ::ThreadCategory::Producer : PipelineQ::ThreadCategory::Consumer;
  pipeline_params.is_leader = producer_thread;
  pipeline_params.num_consumers = 128 * Traits::kConsumers;
  PipelineQ pipeline_q(storage.pipeline_q, pipeline_params, Shape<_1, _1, _1>{});
  PipelineQ pipeline_do(storage.pipeline_do, pipeline_params, Shape<_1, _1, _1>{});
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (producer_thread) produce_bwd<Traits>(params, storage, pipeline_q, pipeline_do, n_block, kv_head, batch);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    if constexpr (Traits::kSplitsHeadDim)
      consume_bwd_wide<Traits>(params, storage, pipeline_q, pipeline_do, warp_group - 1, n_block, kv_head, batch);
    else
      consume_bwd<Traits>(params, storage, pipeline_q, pipeline_do, warp_group - 1, n_block, kv_head, batch);
  }
#endif
}

}  // namespace flashcute::hopper
