// A split tile's part at its end (bwd_tail_split.h), for both Hopper-path backward designs:
// the consumer's fp32 dK and dV are added into the tile's sums in the workspace, in register
// order, and the part counts itself; the part that counts last reads the sums back.
#pragma once

#include <cute/tensor.hpp>

#include "dq_reduce.h"
#include "hopper/bwd_params.h"
#include "hopper/named_barriers.h"

namespace flashcute::hopper {

// Called by every thread of both consumers (it synchronizes them). Returns whether this part
// counted last: then acc_dk and acc_dv hold the tile's sums, and the caller stores them.
template <class Traits, class Fragment>
CUTE_DEVICE bool add_split_sums(BwdParams<Traits> const& params, typename Traits::SharedStorage& storage, int split,
                                int consumer, int tid, Fragment& acc_dk, Fragment& acc_dv) {
  constexpr int kConsumerElems = decltype(cute::size(acc_dk))::value * 128;
  float* sums = params.args.dkv_accum + int64_t(split) * 2 * Traits::kBlockN * Traits::kHeadDim +
                consumer * kConsumerElems + tid * 4;
  float* sums_dv = sums + Traits::kConsumers * kConsumerElems;
  red_add_fragment(sums, acc_dk);
  red_add_fragment(sums_dv, acc_dv);
  named_barrier_sync(int(BwdBarrier::kDsReady), 128 * Traits::kConsumers);
  if (consumer == 0 && tid == 0)
    storage.last_part = count_arrive(params.args.split_done + split) == params.split.parts - 1;
  named_barrier_sync(int(BwdBarrier::kDsReady), 128 * Traits::kConsumers);
  const bool last = storage.last_part;
  if (last) {
    load_fragment_sums(acc_dk, sums);
    load_fragment_sums(acc_dv, sums_dv);
  }
  return last;
}

}  // namespace flashcute::hopper
