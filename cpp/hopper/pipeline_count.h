// A pipeline position held as one count: the stage index and phase that cutlass's
// PipelineState keeps in two registers are derived from it where used. For warps whose
// registers run out (the 8-bit forward's transposing warps and its 240-register consumers).
#pragma once

#include <cstdint>

#include <cutlass/pipeline/sm90_pipeline.hpp>

namespace flashcute::hopper {

template <int kStages, bool kProducerStart = false>
struct PipelineCount {
  uint32_t count = 0;

  CUTE_DEVICE int index() const { return int(count % kStages); }
  // A producer starts on the opposite phase (cutlass::make_producer_start_state).
  CUTE_DEVICE uint32_t phase() const { return (count / kStages) % 2 ^ uint32_t(kProducerStart); }
  CUTE_DEVICE PipelineCount& operator++() {
    ++count;
    return *this;
  }
  CUTE_DEVICE operator cutlass::PipelineState<kStages>() const {
    return cutlass::PipelineState<kStages>(index(), phase(), count);
  }
};

}  // namespace flashcute::hopper
