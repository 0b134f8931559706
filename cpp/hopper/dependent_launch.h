// A kernel launched as the programmatic dependent of the previous kernel on its stream
// (cudaLaunchAttributeProgrammaticStreamSerialization): it may start once that kernel's CTAs
// have all run griddepcontrol.launch_dependents, and waits for its results with
// griddepcontrol.wait where it needs them.
#pragma once

#include <utility>

#include <cuda_runtime_api.h>

namespace flashcute::hopper {

// `dependent` false: an ordinary launch behind the stream's previous work.
template <class... Params, class... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                             bool dependent, Args&&... args) {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = dependent ? 1 : 0;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace flashcute::hopper
