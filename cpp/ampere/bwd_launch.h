// Host-side launch of the Ampere-path backward for one (dtype, head dim), all on the caller's
// stream: the row-wise prepare pass, then
// - with dq_accum: per chunk of (batch, kv head) pairs (bwd_workspace.h), zero dq_accum,
//   dK/dV over key blocks adding dQ's parts, the dQ conversion;
// - deterministic (no dq_accum): dK/dV over key blocks, then dQ over query blocks; no atomics
//   anywhere, so the gradients are bitwise reproducible.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>

#include <cuda_runtime_api.h>

#include "ampere/bwd_config.h"
#include "ampere/bwd_dq_kernel.h"
#include "ampere/bwd_kernel.h"
#include "bwd_dq_convert.h"
#include "bwd_rowwise.h"
#include "bwd_workspace.h"
#include "launch_status.h"
#include "seq_view.h"

namespace flashcute::ampere {

template <class Traits, class Kernel>
Status prepare_bwd(Kernel kernel, int device) {
  constexpr int kSmem = Traits::kSmemBytes;
  static_assert(kSmem <= 227 * 1024);
  int smem_optin = 0;
  cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  // The kernel's static shared memory (the general variant's sequence view) comes on top.
  cudaFuncAttributes attributes{};
  if (cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess)
    return cuda_status(err, "cudaFuncGetAttributes");
  const int smem_total = kSmem + static_cast<int>(attributes.sharedSizeBytes);
  if (smem_total > smem_optin) {
    return make_status(StatusCode::kNotSupported,
                       "ampere path backward, headdim %d: needs %d bytes of shared memory per "
                       "block, the device allows %d",
                       Traits::kHeadDim, smem_total, smem_optin);
  }
  if (smem_total > 48 * 1024)
    return cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                       "cudaFuncSetAttribute");
  return Status{};
}

template <class Traits, class Kernel>
void launch_bwd_dq(Kernel kernel, const BwdKernelParams& params, cudaStream_t stream) {
  const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.nheads, params.batch);
  kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params);
}

// dK/dV, and with dq_accum dQ's parts and their conversion, for the (batch, kv head) pairs
// [pair_begin, pair_begin + count) (without dq_accum: all of them).
template <class Traits, class Kernel>
Status launch_bwd_chunk(Kernel kernel, const BwdKernelParams& params, int pair_begin, int count,
                        cudaStream_t stream) {
  static_assert(kBwdRowPadding % Traits::kBlockM == 0);
  const bool add_dq = params.dq_accum != nullptr;
  if (add_dq && params.seqlen_q > 0) {
    const size_t accum_bytes =
        size_t(count) * params.heads_per_kv * params.seqlen_q_padded * Traits::kHeadDim * sizeof(float);
    if (cudaError_t err = cudaMemsetAsync(params.dq_accum, 0, accum_bytes, stream); err != cudaSuccess)
      return cuda_status(err, "cudaMemsetAsync (dq_accum)");
  }
  // seqlen_q == 0 still runs: dK and dV must be written (as zeros).
  if (params.seqlen_k > 0) {
    const int key_blocks = (params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
    const dim3 grid = add_dq ? dim3(key_blocks, count) : dim3(key_blocks, params.nheads_kv, params.batch);
    kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params, pair_begin);
  }
  // seqlen_k == 0 still converts: dQ must be written (as zeros).
  if (add_dq && params.seqlen_q > 0) {
    const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, count * params.heads_per_kv);
    bwd_convert_dq_kernel<Traits><<<grid, Traits::kNThreads, 0, stream>>>(params, pair_begin);
  }
  return Status{};
}

template <class Element, int kHeadDim>
Status run_bwd(const BwdKernelParams& call, cudaStream_t stream) {
  // The score hook (softcap, ALiBi), windows, a head dim below the kernel's, variable-length
  // batches and dropout take the general dK/dV kernel (bwd_kernel.h) with the atomic-free
  // design, whose dQ pass handles them at no register cost: dq_accum stays unused.
  const bool dropout = call.dropout_threshold != 0;
  const bool general = ScoreHook::of(call).active() || !MaskPolicy::of(call).dense_or_causal() ||
                       call.headdim < kHeadDim || !SeqView::fixed(call) || dropout;
  BwdKernelParams params = call;
  if (general) params.dq_accum = nullptr;
  using Traits90 = typename BwdTraitsFor<Element, kHeadDim, 90>::type;
  using Traits80 = typename BwdTraitsFor<Element, kHeadDim, 80>::type;
  using DqTraits90 = typename BwdDqTraitsFor<Element, kHeadDim, 90>::type;
  using DqTraits80 = typename BwdDqTraitsFor<Element, kHeadDim, 80>::type;
  auto add_dq_kernel = &bwd_kernel<Element, kHeadDim, true>;
  auto dkv_kernel = &bwd_kernel<Element, kHeadDim, false>;
  auto general_dkv_kernel = &bwd_kernel<Element, kHeadDim, false, true>;
  auto plain_dq_kernel = &bwd_dq_kernel<Element, kHeadDim>;
  auto hooks_dq_kernel = &bwd_dq_kernel<Element, kHeadDim, true>;  // ALiBi, dropout
  auto dq_kernel = ScoreHook::of(call).alibi() || dropout ? hooks_dq_kernel : plain_dq_kernel;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return cuda_status(err, "cudaGetDevice");

  // Per device and cached, as in run_fwd: the tile table of the loaded image.
  constexpr int kCachedDevices = 64;
  static std::array<std::atomic<int>, kCachedDevices> tile_arch{};
  int arch = device < kCachedDevices ? tile_arch[device].load(std::memory_order_acquire) : 0;
  if (arch == 0) {
    cudaFuncAttributes attributes{};
    if (cudaError_t err = cudaFuncGetAttributes(&attributes, dkv_kernel); err != cudaSuccess)
      return cuda_status(err, "cudaFuncGetAttributes (no kernel image for this GPU?)");
    arch = attributes.ptxVersion >= 90 ? 90 : 80;
    for (auto kernel : {add_dq_kernel, dkv_kernel, general_dkv_kernel}) {
      const Status prepared = arch == 90 ? prepare_bwd<Traits90>(kernel, device)
                                         : prepare_bwd<Traits80>(kernel, device);
      if (!prepared.ok()) return prepared;
    }
    for (auto kernel : {plain_dq_kernel, hooks_dq_kernel}) {
      const Status prepared = arch == 90 ? prepare_bwd<DqTraits90>(kernel, device)
                                         : prepare_bwd<DqTraits80>(kernel, device);
      if (!prepared.ok()) return prepared;
    }
    if (device < kCachedDevices) tile_arch[device].store(arch, std::memory_order_release);
  }
  if (arch == 90 && !compiled_for<kHeadDim, 90>())  // the dispatch policy runs a larger kernel instead
    return make_status(StatusCode::kNotSupported,
                       "ampere path backward, headdim %d: this build has no sm90 code for it "
                       "(FLASHCUTE_AMPERE_SM90_HEAD_DIMS)",
                       kHeadDim);

  using Rows = RowwiseShape<kHeadDim>;
  if (params.seqlen_q > 0) {
    const dim3 rows_grid((params.seqlen_q_padded + Rows::kRowsPerBlock - 1) / Rows::kRowsPerBlock,
                         params.nheads, params.batch);
    bwd_prepare_kernel<Element, kHeadDim><<<rows_grid, Rows::kThreads, 0, stream>>>(params);
  }
  const bool add_dq = params.dq_accum != nullptr;
  const int pairs = params.batch * params.nheads_kv;
  const int chunk = add_dq ? static_cast<int>(bwd_workspace(params.batch, params.nheads, params.nheads_kv,
                                                            params.seqlen_q, params.seqlen_k, kHeadDim,
                                                            /*lse_log2=*/false, /*dq_accum=*/true)
                                                  .chunk_pairs)
                           : pairs;  // one launch over (key blocks, kv heads, batch)
  auto kernel = add_dq ? add_dq_kernel : general ? general_dkv_kernel : dkv_kernel;
  for (int pair_begin = 0; pair_begin < pairs; pair_begin += chunk) {
    const int count = std::min(chunk, pairs - pair_begin);
    const Status launched = arch == 90 ? launch_bwd_chunk<Traits90>(kernel, params, pair_begin, count, stream)
                                       : launch_bwd_chunk<Traits80>(kernel, params, pair_begin, count, stream);
    if (!launched.ok()) return launched;
  }
  if (!add_dq && params.seqlen_q > 0) {
    // seqlen_k == 0 still runs: dQ must be written (as zeros).
    if (arch == 90) launch_bwd_dq<DqTraits90>(dq_kernel, params, stream);
    else launch_bwd_dq<DqTraits80>(dq_kernel, params, stream);
  }
  return cuda_status(cudaGetLastError(), "ampere backward launch");
}

}  // namespace flashcute::ampere
