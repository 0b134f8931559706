// Hopper-path attention forward kernel (sm90a): warp-specialized, persistent.
//
// Warpgroup 0 is the producer: it gives up registers (setmaxnreg) and one of its threads
// issues all TMA loads. Warpgroups 1..kConsumers take the registers and compute, each on its
// own 64 query rows. K and V flow through separate mbarrier pipelines; Q has a full/empty
// barrier pair and is loaded once per tile.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cluster_launch.hpp>

#include "hopper/fwd_consumer.h"
#include "hopper/fwd_params.h"
#include "hopper/fwd_producer.h"
#include "hopper/fwd_v_transpose.h"

namespace flashcute::hopper {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    fwd_kernel(__grid_constant__ const FwdParams<Traits> params) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using PipelineKV = typename Traits::PipelineKV;
  extern __shared__ __align__(1024) char smem_raw[];
  auto& storage = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);

  const int warp_group = __shfl_sync(0xffffffff, threadIdx.x / 128, 0);
  const int warp_in_group = __shfl_sync(0xffffffff, (threadIdx.x / 32) % 4, 0);
  const bool producer_thread = threadIdx.x == 0;

  if (producer_thread) {
    prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_o.get_tma_descriptor());
    storage.q_full.init(1);
    storage.q_empty.init(Traits::kQEmptyArrivals);
    storage.o_empty.init(Traits::kConsumers);
    if constexpr (Traits::kClaimsTiles)
      storage.claims.init(4 * Traits::kConsumers + Traits::kTransposeWarps);  // the warps that read each claimed tile
  }

  typename PipelineKV::Params pipeline_params;
  pipeline_params.transaction_bytes = Traits::kKBlockBytes;
  pipeline_params.role = warp_group == 0 ? PipelineKV::ThreadCategory::Producer
                                         : PipelineKV::ThreadCategory::Consumer;
  pipeline_params.is_leader = producer_thread;
  pipeline_params.num_consumers = 128 * Traits::kConsumers;
  PipelineKV pipeline_k(storage.pipeline_k, pipeline_params, Shape<_1, _1, _1>{});
  pipeline_params.transaction_bytes = Traits::kVBlockBytes;  // V's blocks are kHeadDimV wide
  if constexpr (Traits::kTransposesV) {  // V's stages go to the transposing warps
    pipeline_params.role = warp_group != 0      ? PipelineKV::ThreadCategory::NonParticipant
                           : warp_in_group == 0 ? PipelineKV::ThreadCategory::Producer
                                                : PipelineKV::ThreadCategory::Consumer;
    pipeline_params.num_consumers = 32 * Traits::kTransposeWarps;
  }
  PipelineKV pipeline_v(storage.pipeline_v, pipeline_params, Shape<_1, _1, _1>{});
  // 8-bit: the transposed stages, from the transposing warps to the consumers.
  using PipelineVt = typename Traits::PipelineVt;
  typename PipelineVt::Params vt_params;
  vt_params.role = warp_group != 0 ? PipelineVt::ThreadCategory::Consumer : PipelineVt::ThreadCategory::Producer;
  vt_params.producer_arv_count = 32 * Traits::kTransposeWarps;
  vt_params.consumer_arv_count = 128 * Traits::kConsumers;
  PipelineVt pipeline_vt(storage.pipeline_vt, vt_params, cute::bool_constant<Traits::kTransposesV>{});
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    // One branch or the other: what the transposing warps hold is not live in the TMA thread.
    if (warp_in_group == 0) {
      if (producer_thread) produce_fwd<Traits>(params, storage, pipeline_k, pipeline_v);
    } else if constexpr (Traits::kTransposesV) {
      transpose_v<Traits>(params, storage, pipeline_v, pipeline_vt);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    if constexpr (Traits::kTransposesV) consume_fwd<Traits>(params, storage, pipeline_k, pipeline_vt, warp_group - 1);
    else consume_fwd<Traits>(params, storage, pipeline_k, pipeline_v, warp_group - 1);
  }
#endif
}

// Zeroes the split tiles' counts (fwd_tail_split.h) or the tile claims' counter
// (tile_scheduler.h) for a forward kernel launched as this grid's programmatic dependent: that
// kernel starts at once and waits for this grid only where a piece counts itself
// (leave_split_piece) or before its first claim, so the zeroing runs under its first key blocks
// instead of ahead of it, as a memset would.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) fwd_zero_counts(int* counts, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  for (int i = threadIdx.x; i < n; i += kThreads) counts[i] = 0;
#endif
}

}  // namespace flashcute::hopper
