// Host entry of the merge kernel (merge_states.cu), for the plain C++ API.
#pragma once

#include <cuda_runtime_api.h>

#include "flashcute/flashcute.h"
#include "merge_states.h"

namespace flashcute {

enum class MergeElement { kFloat16, kBFloat16, kFloat32 };

// `after_producer`: launched as the programmatic dependent of the stream's previous kernel, which
// it waits for in the kernel (where the device runs its sm90 image; otherwise a plain launch).
Status launch_merge_states(const MergeStatesParams& p, MergeElement in, MergeElement out, bool after_producer,
                           cudaStream_t stream);

}  // namespace flashcute
