// Epilogue of a Hopper-path consumer: O (already normalized) goes registers -> shared memory
// (stmatrix) -> global memory (one TMA store per consumer's 64 rows, clipped at seqlen_q by
// the tensor map; none for rows before 0; packed query heads: fwd_packed_heads.h); LSE is
// written from registers. Packed variable-length queries (cu_seqlens_q): the rows past a
// sequence belong to the next one, so a block that reaches past its sequence is stored row
// by row from shared memory instead. Where O is staged in V's or Q's buffer, the epilogue
// also tells the producer when that buffer may be loaded again.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "fragment_views.h"
#include "hopper/fwd_params.h"
#include "hopper/named_barriers.h"
#include "hopper/seq_rows.h"
#include "seq_view.h"

namespace flashcute::hopper {

// The thread's index in its consumer warpgroup, read afresh where called. Offsets derived
// from it are then computed there, not hoisted out of the tile loop and kept live through
// the key-block loops (where they made ptxas spill at hd 192 and 256).
CUTE_DEVICE int opaque_consumer_thread() {
  int thread;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(thread));
  return thread % 128;
}

template <class Traits>
struct FwdEpilogue {
  using ElementO = typename Traits::ElementO;
  FwdParams<Traits> const& params;
  typename Traits::SharedStorage& storage;
  int consumer;
  int tid;

  CUTE_DEVICE FwdEpilogue(FwdParams<Traits> const& params_, typename Traits::SharedStorage& storage_, int consumer_)
      : params(params_), storage(storage_), consumer(consumer_), tid(threadIdx.x % 128) {}

  CUTE_DEVICE ElementO* o_buffer() const {
    if constexpr (Traits::kOAliasesQ) return reinterpret_cast<ElementO*>(storage.q.data());
    if constexpr (Traits::kOAliasesV) return reinterpret_cast<ElementO*>(storage.v.data());
    return storage.o.data();
  }

  // O staged in V's buffer: the producer holds the next tile's V loads until the previous
  // tile's O stores have read the buffer. The wait is deferred to here (after the next tile's
  // first Q·Kᵀ is issued, before its first V is needed) so the store overlaps that GEMM.
  CUTE_DEVICE void release_previous_o(int iteration) const {
    if constexpr (Traits::kOAliasesV) {
      if (iteration > 0 && tid == 0) {
        cute::tma_store_wait<0>();
        storage.o_empty.arrive();
      }
    }
  }

  // row0: the first of this consumer's 64 query rows (tile_row0 + 64 * consumer; a multiple
  // of 64 below 0 in a shifted first tile).
  template <class AccO, int kThreadRows>
  CUTE_DEVICE void store(AccO const& acc_o, const float (&lse)[kThreadRows], FwdTile const& tile, int row0) {
    using namespace cute;
    const FwdKernelParams& args = params.args;
    Tensor o = convert_fragment<ElementO>(acc_o);
    if constexpr (Traits::kTransposesV) {  // FP8's 16-bit O: float16 bits where the caller asks for them
      if (args.out_fp16) {
        Tensor o_fp16 = convert_fragment<cutlass::half_t>(acc_o);
        CUTE_UNROLL
        for (int i = 0; i < size(o); ++i) o(i) = ElementO::bitcast(o_fp16(i).raw());
      }
    }
    // At hd 192 and 256 the offsets below are recomputed per tile (opaque_consumer_thread);
    // smaller head dims keep them live, which saves the recomputation on every tile.
    const int thread = Traits::kHeadDim >= 192 ? opaque_consumer_thread() : tid;

    Tensor sO = make_tensor(make_smem_ptr(o_buffer()), typename Traits::SmemLayoutO{})(_, _, consumer);
    auto smem_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, typename Traits::TiledMmaPV{});
    auto smem_thr_copy = smem_copy.get_thread_slice(thread);
    if (tid == 0) tma_store_wait<0>();  // the previous tile's store has read the buffer
    // O in V's buffer: every consumer's last P·V must have read V first.
    if constexpr (Traits::kOAliasesV) last_pv_done_sync(Traits::kConsumers);
    else epilogue_barrier_sync(consumer);
    copy(smem_copy, smem_thr_copy.retile_S(o), smem_thr_copy.partition_D(sO));
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes visible to the TMA
    // The tile's sequence (seq_view.h), once O has left the registers.
    const SeqView view = SeqView::of(args, tile.batch);
    // Packed queries whose block reaches past the sequence: rows stored one by one.
    const bool row_stores = args.cu_seqlens_q != nullptr && row0 + Traits::kRowsPerConsumer > view.seqlen_q;
    epilogue_barrier_sync(consumer);
    if (row_stores) {  // no packed query heads here (a variable-length batch never packs them)
      ElementO* out = static_cast<ElementO*>(args.out) + tile.batch * args.out_batch_stride +
                     tile.head * args.out_head_stride + int64_t(view.q_start + row0) * args.out_row_stride;
      store_tile_rows(sO, out, args.out_row_stride, view.seqlen_q - row0, args.headdim_v, thread, 128);
      epilogue_barrier_sync(consumer);  // the buffer is read: free for the next tile (as after a TMA store)
    }
    if (tid == 0) {
      if (params.packed_heads > 1) {  // query rows row0 / G.. of the group's heads (fwd_packed_heads.h)
        if constexpr (kPacksQueryHeads<Traits>) {
          CUTE_UNROLL
          for (int col = 0; col < Traits::kHeadDimV; col += 64)
            SM90_TMA_STORE_5D::copy(&params.tma_o_packed, o_buffer() + packed_o_box_offset<Traits>(consumer, col), col,
                                    0, row0 / params.packed_heads, tile.head, tile.batch);
        }
      } else if (row0 >= 0 && !row_stores) {  // rows before 0 (a shifted first tile) are padding, never stored
        Tensor mO = params.tma_o.get_tma_tensor(make_shape(args.seqlen_q, int(Traits::kHeadDimV), args.nheads, args.batch));
        Tensor gO = local_tile(domain_offset(make_coord(view.q_start + row0, _0{}),
                                             mO(_, _, tile.head, tma_batch(args.cu_seqlens_q, tile.batch))),
                               typename Traits::TileO{}, make_coord(_0{}, _0{}));
        auto tma_o = params.tma_o.get_slice(_0{});
        copy(params.tma_o, tma_o.partition_S(sO), tma_o.partition_D(gO));
      }
      tma_store_arrive();
      if constexpr (Traits::kOAliasesQ) {
        tma_store_wait<0>();  // O has left the buffer: the producer may load the next Q
        storage.q_empty.arrive();
      }
    }

    if (args.lse != nullptr && tid % 4 == 0) {
      float* lse_base = args.lse + tile.batch * args.lse_batch_stride + view.q_start;
      Tensor tOcO = typename Traits::TiledMmaPV{}.get_thread_slice(thread).partition_C(
          make_identity_tensor(typename Traits::TileO{}));
      Tensor tOcO_rc = make_tensor(tOcO.data(), rowcol_layout(tOcO.layout()));
      CUTE_UNROLL
      for (int r = 0; r < kThreadRows; ++r) {
        const int row = row0 + get<0>(tOcO_rc(r, 0));
        if (row < 0 || row >= view.seqlen_q) continue;
        const QueryRowOf query = query_row_of(params, tile.head, row);
        lse_base[query.head * args.lse_head_stride + query.row] = lse[r];
      }
    }
  }

  // Before the CTA exits: the last TMA store has read shared memory.
  CUTE_DEVICE void drain() const {
    if (tid == 0) cute::tma_store_wait<0>();
  }
};

}  // namespace flashcute::hopper
