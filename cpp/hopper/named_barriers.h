// Named barriers of the Hopper-path kernels (id 0 is __syncthreads). In the forward the
// consumer warpgroups take turns issuing WGMMAs: a warpgroup waits on its own barrier, issues,
// then arrives on the next one's, so one warpgroup's GEMMs run while the other does its softmax.
#pragma once

#include <cute/config.hpp>

namespace flashcute::hopper {

enum class FwdBarrier : int {
  kMmaTurn0 = 1,       // kMmaTurn0 + c: consumer c may issue its next GEMMs
  kEpilogue0 = 1 + 4,  // kEpilogue0 + c: consumer c's 128 threads around its O tile
  kLastPvDone = 1 + 8, // all consumers: no WGMMA reads V any more (O is staged in V's buffer)
  kSplitCount = 1 + 9, // all consumers, around counting a split tile's piece done
  kKeptMax0 = 1 + 10,  // kKeptMax0 + c: consumer c's 128 threads agree to keep the row max
};

// Backward: both consumers' dS tiles are in shared memory (256 threads); one consumer's
// threads around its own shared-memory buffers (128 threads each).
enum class BwdBarrier : int {
  kDsReady = 1,
  kConsumer0 = 2,  // kConsumer0 + c
  kDsFull0 = 4,    // + 2 * owner + buffer: the owner's dS tile in that buffer is written
  kDsFree0 = 8,    // + 2 * owner + buffer: the other consumer's dQ GEMM has read it
};

CUTE_DEVICE void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

CUTE_DEVICE void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

template <int kConsumers>
struct MmaTurns {
  int consumer;
  CUTE_DEVICE void wait() const {
    if constexpr (kConsumers > 1) named_barrier_sync(int(FwdBarrier::kMmaTurn0) + consumer, 256);
  }
  // The last consumer hands the first turn to consumer 0.
  CUTE_DEVICE void start() const {
    if (consumer == kConsumers - 1) pass();
  }
  CUTE_DEVICE void pass() const {
    if constexpr (kConsumers > 1)
      named_barrier_arrive(int(FwdBarrier::kMmaTurn0) + (consumer + 1) % kConsumers, 256);
  }
};

// Whether `value` holds in every thread (all_of_threads) or in any thread (any_of_threads) of
// the `threads` that meet at barrier `id`. Like bar.sync, bar.red orders the participants'
// earlier memory accesses before their later ones; any_of_threads also tells the compiler so
// (it stands where a bar.sync did), all_of_threads, on the softmax's hot path, does not.
CUTE_DEVICE bool all_of_threads(bool value, int id, int threads) {
  int result;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.b32 p, %1, 0;\n bar.red.and.pred q, %2, %3, p;\n"
      " selp.b32 %0, 1, 0, q;\n}"
      : "=r"(result)
      : "r"(int(value)), "r"(id), "r"(threads));
  return result != 0;
}

CUTE_DEVICE bool any_of_threads(bool value, int id, int threads) {
  int result;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.b32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n"
      " selp.b32 %0, 1, 0, q;\n}"
      : "=r"(result)
      : "r"(int(value)), "r"(id), "r"(threads)
      : "memory");
  return result != 0;
}

CUTE_DEVICE void epilogue_barrier_sync(int consumer) {
  named_barrier_sync(int(FwdBarrier::kEpilogue0) + consumer, 128);
}

CUTE_DEVICE void last_pv_done_sync(int consumers) {
  named_barrier_sync(int(FwdBarrier::kLastPvDone), 128 * consumers);
}

}  // namespace flashcute::hopper
