// Kernel arguments of the Hopper-path backward: the shared launch arguments plus the TMA
// descriptors (built on the host, read from the __grid_constant__ parameter space).
#pragma once

#include "kernel_params.h"

namespace flashcute::hopper {

template <class Traits>
struct BwdParams {
  BwdKernelParams args;
  typename Traits::TmaQ tma_q;
  typename Traits::TmaQ tma_do;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  typename Traits::TmaDkv tma_dk;
  typename Traits::TmaDkv tma_dv;
  int tma_seqlen_q;  // seqlen_q, or 1 when there are no queries (a TMA dimension cannot be 0)
  int pair_begin;    // first (batch, kv head) pair of this launch's dq_accum chunk
};

}  // namespace flashcute::hopper
