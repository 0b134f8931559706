// Host-side launch of the Ampere-path backward for one (dtype, head dim), all on one stream:
// the row-wise prepare pass, then dK/dV over key blocks and dQ over query blocks. No atomics
// anywhere, so the gradients are bitwise reproducible.
#pragma once

#include <array>
#include <atomic>

#include <cuda_runtime_api.h>

#include "ampere/bwd_config.h"
#include "ampere/bwd_dq_kernel.h"
#include "ampere/bwd_kernel.h"
#include "bwd_rowwise.h"
#include "launch_status.h"

namespace flashcute::ampere {

template <class Traits, class Kernel>
Status prepare_bwd(Kernel kernel, int device) {
  constexpr int kSmem = Traits::kSmemBytes;
  static_assert(kSmem <= 227 * 1024);
  int smem_optin = 0;
  cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (kSmem > smem_optin) {
    return make_status(StatusCode::kNotSupported,
                       "ampere path backward, headdim %d: needs %d bytes of shared memory per "
                       "block, the device allows %d",
                       Traits::kHeadDim, kSmem, smem_optin);
  }
  if (kSmem > 48 * 1024)
    return cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                       "cudaFuncSetAttribute");
  return Status{};
}

template <class Traits, class Kernel>
void launch_bwd_main(Kernel kernel, const BwdKernelParams& params, cudaStream_t stream) {
  const dim3 grid((params.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, params.nheads_kv,
                  params.batch);
  kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params);
}

template <class Traits, class Kernel>
void launch_bwd_dq(Kernel kernel, const BwdKernelParams& params, cudaStream_t stream) {
  const dim3 grid((params.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, params.nheads, params.batch);
  kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params);
}

template <class Element, int kHeadDim>
Status run_bwd(const BwdKernelParams& params, cudaStream_t stream) {
  using Traits90 = typename BwdTraitsFor<Element, kHeadDim, 90>::type;
  using Traits80 = typename BwdTraitsFor<Element, kHeadDim, 80>::type;
  using DqTraits90 = typename BwdDqTraitsFor<Element, kHeadDim, 90>::type;
  using DqTraits80 = typename BwdDqTraitsFor<Element, kHeadDim, 80>::type;
  auto kernel = &bwd_kernel<Element, kHeadDim>;
  auto dq_kernel = &bwd_dq_kernel<Element, kHeadDim>;
  int device = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return cuda_status(err, "cudaGetDevice");

  // Per device and cached, as in run_fwd: the tile table of the loaded image.
  constexpr int kCachedDevices = 64;
  static std::array<std::atomic<int>, kCachedDevices> tile_arch{};
  int arch = device < kCachedDevices ? tile_arch[device].load(std::memory_order_acquire) : 0;
  if (arch == 0) {
    cudaFuncAttributes attributes{};
    if (cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess)
      return cuda_status(err, "cudaFuncGetAttributes (no kernel image for this GPU?)");
    arch = attributes.ptxVersion >= 90 ? 90 : 80;
    const Status prepared = arch == 90 ? prepare_bwd<Traits90>(kernel, device)
                                       : prepare_bwd<Traits80>(kernel, device);
    if (!prepared.ok()) return prepared;
    const Status dq_prepared = arch == 90 ? prepare_bwd<DqTraits90>(dq_kernel, device)
                                          : prepare_bwd<DqTraits80>(dq_kernel, device);
    if (!dq_prepared.ok()) return dq_prepared;
    if (device < kCachedDevices) tile_arch[device].store(arch, std::memory_order_release);
  }

  using Rows = RowwiseShape<kHeadDim>;
  if (params.seqlen_q > 0) {
    const dim3 rows_grid((params.seqlen_q_padded + Rows::kRowsPerBlock - 1) / Rows::kRowsPerBlock,
                         params.nheads, params.batch);
    bwd_prepare_kernel<Element, kHeadDim><<<rows_grid, Rows::kThreads, 0, stream>>>(params);
  }
  if (params.seqlen_k > 0) {
    // seqlen_q == 0 still runs: dK and dV must be written (as zeros).
    if (arch == 90) launch_bwd_main<Traits90>(kernel, params, stream);
    else launch_bwd_main<Traits80>(kernel, params, stream);
  }
  if (params.seqlen_q > 0) {
    // seqlen_k == 0 still runs: dQ must be written (as zeros).
    if (arch == 90) launch_bwd_dq<DqTraits90>(dq_kernel, params, stream);
    else launch_bwd_dq<DqTraits80>(dq_kernel, params, stream);
  }
  return cuda_status(cudaGetLastError(), "ampere backward launch");
}

}  // namespace flashcute::ampere
