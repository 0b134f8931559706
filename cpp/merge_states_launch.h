// Host entry of the merge kernel (merge_states.cu), for the plain C++ API.
#pragma once

#include <cuda_runtime_api.h>

#include "flashcute/flashcute.h"
#include "merge_states.h"

namespace flashcute {

enum class MergeElement { kFloat16, kBFloat16, kFloat32 };

Status launch_merge_states(const MergeStatesParams& p, MergeElement in, MergeElement out, cudaStream_t stream);

}  // namespace flashcute
