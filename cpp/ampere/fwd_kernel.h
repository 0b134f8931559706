// Ampere-path attention forward: cp.async K/V pipeline, ldmatrix, mma.sync through TiledMma.
//
// One CTA computes O for kBlockM query rows of one (batch, head). Key blocks are visited from
// the last to the first, so the blocks that need masking (the seqlen_k tail, the causal
// diagonal or the window's right side) come first, the unmasked bulk runs without mask code,
// and the blocks on the window's left side (mask.h) come last.
//
// Dropout (dropout.h) is a uniform branch per block: after the online softmax has taken the
// block's weights into the row sums (the LSE is dropout's), the dropped weights are zeroed in
// P before P·V, and O takes 1 / (1 - p) with its normalization.
//
// Variable-length batches (seq_view.h): the grid is sized from the longest sequence; a CTA
// whose rows start past its sequence's end exits at once, and every row and key offset, length
// and mask comes from the sequence's view (constants of the parameters for a fixed-length call).
//
// KV caches: key rows come from pages where the call has a page table (kv_rows.h), query heads
// may be packed into rows (packed_rows.h), and a tile's key blocks may be split over CTAs whose
// partial results merge_states.h combines (split_kv.h). Each is one uniform branch around a
// load or a store; the math is the same.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm80.hpp>

#include "ampere/fwd_config.h"
#include "ampere/dropout_fragments.h"
#include "ampere/row_gather.h"
#include "ampere/smem_gemm.h"
#include "fragment_views.h"
#include "kernel_params.h"
#include "kv_rows.h"
#include "mask.h"
#include "online_softmax.h"
#include "packed_rows.h"
#include "paged_kernels.h"
#include "score_hook.h"
#include "seq_view.h"
#include "split_kv.h"

namespace flashcute::ampere {

// acc += P·V, P taken from the fp32 scores in registers and converted to Element one k-slice
// (16 keys) at a time, so only a slice of P is live next to the scores. V slices are read
// just before use (reading ahead measured no faster and costs registers).
template <class Element, class Acc, class ScoresA, class FragB, class SmemB, class ViewB,
          class TiledMma, class CopyB>
CUTE_DEVICE void gemm_pv(Acc& acc, ScoresA const& scores_a, FragB const& frag_b, SmemB const& smem_b,
                         ViewB&& view_b, TiledMma const& mma, CopyB const& copy_b) {
  using namespace cute;
  constexpr int kSlices = decltype(size<2>(scores_a))::value;
  CUTE_UNROLL
  for (int k = 0; k < kSlices; ++k) {
    copy(copy_b, smem_b(_, _, k), view_b(_, _, k));
    Tensor p = convert_fragment<Element>(scores_a(_, _, k));
    gemm(mma, p, frag_b(_, _, k), acc);
  }
}

// A split's part of a tile (split_kv.h): the normalized fp32 output and LSE of its rows, straight
// from the accumulator registers (decoding tiles have few rows; merge_states.h reads them).
template <class TileQ, class AccRC, int kRows, class ThrMma>
CUTE_DEVICE void store_split_part(FwdKernelParams const& p, AccRC const& acc_o_rc, float const (&lse)[kRows],
                                  ThrMma const& thr_mma, PackedRows packed, SeqView const& seq, int batch, int head,
                                  int split, int row0, int seqlen_q) {
  using namespace cute;
  Tensor tOcO = thr_mma.partition_C(make_identity_tensor(TileQ{}));
  Tensor tOcO_rc = make_tensor(tOcO.data(), rowcol_layout(tOcO.layout()));
  SplitKvLayout layout;
  layout.rows = p.partial_rows, layout.heads = p.partial_heads, layout.headdim_v = p.headdim_v;
  // Workspace row of query row 0: batch · seqlen_q for a batched q, the sequence's start if packed.
  const int64_t first_row = p.cu_seqlens_q != nullptr ? seq.q_start : int64_t(batch) * (p.seqlen_q / packed.group);
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int row = row0 + get<0>(tOcO_rc(r, 0));
    if (row >= seqlen_q) continue;
    const int query_head = packed.head_of(head, row);
    const int64_t part_row = first_row + packed.row_of(row);
    float* o = p.partial_o + layout.o_index(split, query_head, part_row);
    CUTE_UNROLL
    for (int c = 0; c < size<1>(acc_o_rc); ++c) {
      const int col = get<1>(tOcO_rc(r, c));
      if (col < p.headdim_v) o[col] = acc_o_rc(r, c);
    }
    if (threadIdx.x % 4 == 0) p.partial_lse[layout.lse_index(split, query_head, part_row)] = lse[r];
  }
}

template <class Traits>
CUTE_DEVICE void fwd_block(const FwdKernelParams params) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  using TileQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using TileKV = Shape<Int<kBlockN>, Int<kHeadDim>>;

  extern __shared__ __align__(128) char smem_raw[];
  Element* smem = reinterpret_cast<Element*>(smem_raw);
  // [stage 0][Q | stages 1..] when Q moves to registers, else [Q][stage 0][stages 1..].
  Element* smem_q = Traits::kQInRegs ? smem + Traits::kStageElems : smem;
  auto stage_k = [&](int stage) {
    Element* base = Traits::kQInRegs
                        ? (stage == 0 ? smem : smem_q + (stage - 1) * Traits::kStageElems)
                        : smem + Traits::kQElems + stage * Traits::kStageElems;
    return base;
  };

  const int tid = threadIdx.x;
  // Causal CTAs with more keys come first, so the longest work does not trail the grid.
  const int m_block = params.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int head = blockIdx.y;
  const SplitKv split_kv{params.num_splits > 1 ? params.num_splits : 1};
  const int batch = split_kv.splits > 1 ? blockIdx.z / split_kv.splits : blockIdx.z;
  const int split = blockIdx.z - batch * split_kv.splits;
  const int kv_head = head / params.heads_per_kv;
  const int row0 = m_block * kBlockM;
  const SeqView seq = SeqView::of(params, batch);
  const PackedRows packed = PackedRows::of(params);
  // Rows of the next sequence (a shorter one than the grid's): nothing to compute or write.
  if (row0 >= seq.seqlen_q) return;
  const int seqlen_q = seq.seqlen_q;
  const int seqlen_k = seq.seqlen_k;

  // The hook is read from the kernel parameters where used (constant bank operands), not
  // held in registers: the kernels run at the register cap.
  const KeyBlockRange range = key_block_range<kBlockN>(seq.mask(params), row0, kBlockM);
  int n_begin = range.n_begin, n_end = range.n_end;
  if (split_kv.splits > 1) split_kv.range(split, n_begin, n_end);
  // A head dim below the kernel's (rounded up to it): the columns past it are zeros in shared
  // memory and neither loaded nor stored (smem_gemm.h). One uniform branch per copy; the
  // kernel's own head dim runs the copies without column tests.
  const bool partial_cols = params.headdim < kHeadDim;

  // Packed, `head` is a K/V head and q_base its group's first query head (packed_rows.h).
  const Element* q_base = static_cast<const Element*>(params.q) + batch * params.q_batch_stride +
                          int64_t(packed.head_of(head, 0)) * params.q_head_stride +
                          int64_t(seq.q_start + row0) * params.q_row_stride;
  // A paged cache's rows are offsets from the head's column of the cache (kv_rows.h).
  // Paged loads exist in the kernels of larger head dims only (paged_kernels.h).
  constexpr bool kPagedLoads = has_paged_loads(kHeadDim);
  const bool paged = kPagedLoads && params.page_table != nullptr;
  const int64_t k_batch_offset = paged ? 0 : batch * params.k_batch_stride;
  const int64_t v_batch_offset = paged ? 0 : batch * params.v_batch_stride;
  const Element* k_base = static_cast<const Element*>(params.k) + k_batch_offset +
                          kv_head * params.k_head_stride + int64_t(seq.k_start) * params.k_row_stride;
  const Element* v_base = static_cast<const Element*>(params.v) + v_batch_offset +
                          kv_head * params.v_head_stride + int64_t(seq.k_start) * params.v_row_stride;

  Tensor gQ = make_tensor(make_gmem_ptr(q_base), TileQ{}, make_stride(params.q_row_stride, _1{}));
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});

  typename Traits::GmemTiledCopyLoad gmem_copy;
  auto gmem_thr_copy = gmem_copy.get_thread_slice(tid);
  Tensor cQ = gmem_thr_copy.partition_S(make_identity_tensor(TileQ{}));
  Tensor cKV = gmem_thr_copy.partition_S(make_identity_tensor(TileKV{}));

  // A paged cache (kv_rows.h): thread t < kBlockN reads the table entry of key row t two blocks
  // before the block is loaded, and turns it into the row's offsets in the shared row table
  // before the barrier that precedes the load. Each row's page is read and its offsets computed
  // once, and the entry's latency passes under two blocks' work (under one, warps still waited).
  KvRowOffsets* row_table = reinterpret_cast<KvRowOffsets*>(smem_raw + Traits::kTileBytes);
  int entry_next = 0, entry_after = 0;  // of the next block to load and of the one after it
  auto read_entry = [&](int n) {
    const int key = n * kBlockN + tid;
    return tid < kBlockN && n >= n_begin && key < seqlen_k ? KvRows::of(params, batch).table_entry(key) : 0;
  };
  // Block n's offsets (entry: its row's table entry), in the half of the row table of n's parity.
  auto write_row_offsets = [&](int n, int entry) {
    if (tid < kBlockN)
      row_table[(n & 1) * kBlockN + tid] = KvRows::of(params, batch).offsets(entry, n * kBlockN + tid, params);
  };

  // Issues the cp.async copies of key block n into a pipeline stage. Only the first block
  // loaded (the highest one) can be partial; every refill inside the loop is a full block.
  // Rows past seqlen_k land as zeros: they may belong to the next sequence or be unused keys
  // past seqused_k holding anything (NaN included), and P = 0 times NaN would poison P·V.
  auto load_kv = [&](int n, int stage, auto may_be_partial) {
    Element* sk_ptr = stage_k(stage);
    Tensor sK = make_tensor(make_smem_ptr(sk_ptr), typename Traits::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(sk_ptr + Traits::kKVElems), typename Traits::SmemLayoutKV{});
    const int64_t row = int64_t(n) * kBlockN;
    Tensor gK = make_tensor(make_gmem_ptr(k_base + row * params.k_row_stride), TileKV{},
                            make_stride(params.k_row_stride, _1{}));
    Tensor gV = make_tensor(make_gmem_ptr(v_base + row * params.v_row_stride), TileKV{},
                            make_stride(params.v_row_stride, _1{}));
    Tensor tKgK = gmem_thr_copy.partition_S(gK);
    Tensor tKsK = gmem_thr_copy.partition_D(sK);
    Tensor tVgV = gmem_thr_copy.partition_S(gV);
    Tensor tVsV = gmem_thr_copy.partition_D(sV);
    const int valid = seqlen_k - n * kBlockN;
    if (kPagedLoads && paged) {  // uniform: rows through the page table
      auto row_stride0 = make_stride(Int<0>{}, _1{});
      Tensor tKgK0 = gmem_thr_copy.partition_S(make_tensor(make_gmem_ptr(k_base), TileKV{}, row_stride0));
      Tensor tVgV0 = gmem_thr_copy.partition_S(make_tensor(make_gmem_ptr(v_base), TileKV{}, row_stride0));
      const KvRowOffsets* rows = row_table + (n & 1) * kBlockN;
      auto k_row = [&](int row, int) { return rows[row].k; };
      auto v_row = [&](int row, int) { return rows[row].v; };
      if (decltype(may_be_partial)::value && valid < kBlockN) {  // only the first block loaded
        gather_tile<true>(gmem_copy, tKgK0, tKsK, cKV, valid, params.headdim, partial_cols, k_row);
        gather_tile<true>(gmem_copy, tVgV0, tVsV, cKV, valid, params.headdim, partial_cols, v_row);
      } else {
        gather_tile<false>(gmem_copy, tKgK0, tKsK, cKV, valid, params.headdim, partial_cols, k_row);
        gather_tile<false>(gmem_copy, tVgV0, tVsV, cKV, valid, params.headdim, partial_cols, v_row);
      }
      entry_next = entry_after;
      entry_after = read_entry(n - 2);
    } else if (partial_cols) {
      load_tile_cols<decltype(may_be_partial)::value>(gmem_copy, tKgK, tKsK, cKV, valid, params.headdim);
      load_tile_cols<decltype(may_be_partial)::value>(gmem_copy, tVgV, tVsV, cKV, valid, params.headdim);
    } else if (decltype(may_be_partial)::value && valid < kBlockN) {
      load_tile<true>(gmem_copy, tKgK, tKsK, cKV, valid);
      load_tile<true>(gmem_copy, tVgV, tVsV, cKV, valid);
    } else {
      load_tile<false>(gmem_copy, tKgK, tKsK, cKV, valid);
      load_tile<false>(gmem_copy, tVgV, tVsV, cKV, valid);
    }
  };

  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  auto smem_copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  auto smem_thr_copy_q = smem_copy_q.get_thread_slice(tid);
  auto smem_thr_copy_k = smem_copy_k.get_thread_slice(tid);
  auto smem_thr_copy_v = smem_copy_v.get_thread_slice(tid);

  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  Tensor tSsQ = smem_thr_copy_q.partition_S(sQ);
  Tensor tSrQ_view = smem_thr_copy_q.retile_D(tSrQ);
  Tensor tSrK = thr_mma.partition_fragment_B(
      make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutKV{}));
  Tensor tOrVt = thr_mma.partition_fragment_B(
      make_tensor(make_smem_ptr(smem), typename Traits::SmemLayoutVt{}));
  Tensor tSrK_view = smem_thr_copy_k.retile_D(tSrK);
  Tensor tOrVt_view = smem_thr_copy_v.retile_D(tOrVt);

  Tensor acc_o = partition_fragment_C(tiled_mma, TileQ{});
  clear(acc_o);
  Tensor acc_o_rc = rowcol_view(acc_o);
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;
  OnlineSoftmax<kRows> softmax(params.scale_log2);
  // Score coordinates: this thread's first element plus offsets known at compile time.
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tScS = thr_mma.partition_C(cS);
  Tensor tScS0 = tiled_mma.get_thread_slice(0).partition_C(cS);
  Tensor score_offsets_rc = make_tensor(tScS0.data(), rowcol_layout(tScS0.layout()));
  const int thread_row = row0 + get<0>(tScS(0));
  const int thread_col = get<1>(tScS(0));

  // Prologue: Q, then the first kStages-1 key blocks.
  // Columns past the head dim are zeroed once per buffer (smem_gemm.h): Q's and stage 0's here,
  // the other stages' once Q has left the buffer they share with it.
  auto clear_stage_cols = [&](int stage) {
    Element* sk_ptr = stage_k(stage);
    clear_tile_cols(gmem_thr_copy.partition_D(make_tensor(make_smem_ptr(sk_ptr), typename Traits::SmemLayoutKV{})),
                    cKV, params.headdim);
    clear_tile_cols(gmem_thr_copy.partition_D(
                        make_tensor(make_smem_ptr(sk_ptr + Traits::kKVElems), typename Traits::SmemLayoutKV{})),
                    cKV, params.headdim);
  };
  if (packed.packed()) {  // uniform: rows of the group's heads (packed_rows.h)
    Tensor tQsQ = gmem_thr_copy.partition_D(sQ);
    if (partial_cols) clear_tile_cols(tQsQ, cQ, params.headdim);
    const Element* q_group = q_base - int64_t(row0) * params.q_row_stride;
    Tensor tQgQ0 = gmem_thr_copy.partition_S(make_tensor(make_gmem_ptr(q_group), TileQ{}, make_stride(Int<0>{}, _1{})));
    gather_tile(gmem_copy, tQgQ0, tQsQ, cQ, seqlen_q - row0, params.headdim, partial_cols, [&](int r, int) {
      return packed.offset(row0 + r, params.q_row_stride, params.q_head_stride);
    });
    if (partial_cols) clear_stage_cols(0);
  } else if (partial_cols) {
    Tensor tQsQ = gmem_thr_copy.partition_D(sQ);
    clear_tile_cols(tQsQ, cQ, params.headdim);
    load_tile_cols<true>(gmem_copy, gmem_thr_copy.partition_S(gQ), tQsQ, cQ, seqlen_q - row0, params.headdim);
    clear_stage_cols(0);
  } else {
    load_tile<true>(gmem_copy, gmem_thr_copy.partition_S(gQ), gmem_thr_copy.partition_D(sQ), cQ,
                    seqlen_q - row0);
  }
  cp_async_fence();
  int n = n_end - 1;
  if (paged && n >= n_begin) {  // the first block's row offsets, before any load
    write_row_offsets(n, read_entry(n));
    entry_after = read_entry(n - 1);
    __syncthreads();
  }
  if (n >= n_begin) load_kv(n, 0, cute::true_type{});
  cp_async_fence();
  if constexpr (Traits::kQInRegs) {
    cp_async_wait<1>();
    __syncthreads();
    copy(smem_copy_q, tSsQ, tSrQ_view);
    __syncthreads();  // Q's smem is stage 1 from here on
  }
  if (partial_cols) {
    CUTE_UNROLL
    for (int s = 1; s < kStages; ++s) clear_stage_cols(s);
  }
  CUTE_UNROLL
  for (int s = 1; s < kStages - 1; ++s) {
    if (paged && n - s >= n_begin) {
      write_row_offsets(n - s, entry_next);
      __syncthreads();
    }
    if (n - s >= n_begin) load_kv(n - s, s, cute::false_type{});
    cp_async_fence();
  }

  int stage = 0;
  // Warp w owns rows 16w + 16·kNWarps·i of the tile (the TiledMma's layout), the first being 16w.
  // Not where Q is re-read from shared memory (the largest head dims): there the test costs the
  // last register (measured: a spill).
  const bool warp_has_rows = !Traits::kQInRegs || row0 + 16 * (tid / 32) < seqlen_q;
  // always_inline: out of line, the by-reference accumulators and params go to local memory
  // (the paged loads made it large enough for the inliner to refuse).
  auto process_block = [&](int n_block, auto masked) __attribute__((always_inline)) {
    const int refill = n_block - (kStages - 1);
    // The refill's row offsets; the last reads of this half of the table were two loads ago.
    if (paged && refill >= n_begin) write_row_offsets(refill, entry_next);
    cp_async_wait<kStages - 2>();
    __syncthreads();  // block n_block visible; every warp is done with the stage refilled next
    const int refill_stage = stage == 0 ? kStages - 1 : stage - 1;
    if (refill >= n_begin) load_kv(refill, refill_stage, cute::false_type{});
    cp_async_fence();

    // A warp whose rows all lie past the tile's last query row (decoding: a few rows in a
    // large tile) only loads; its MMAs would be work on empty rows.
    if (!warp_has_rows) {  // uniform per warp
      stage = stage + 1 == kStages ? 0 : stage + 1;
      return;
    }
    Element* sk_ptr = stage_k(stage);
    Tensor sK = make_tensor(make_smem_ptr(sk_ptr), typename Traits::SmemLayoutKV{});
    Tensor sVt = make_tensor(make_smem_ptr(sk_ptr + Traits::kKVElems), typename Traits::SmemLayoutVt{});

    // Dropout's keep bits, drawn before the scores take their registers (dropout_fragments.h).
    KeepMaskFor<decltype(score_offsets_rc)> keep;
    if (params.dropout_threshold != 0)  // uniform
      keep.template draw<true, kHeadDim <= 64 ? 2 : 1>(Dropout::of(params), score_offsets_rc, thread_row, n_block * kBlockN + thread_col,
                               batch * params.nheads + head);

    Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    gemm_from_smem<Traits::kQInRegs, Traits::kLookaheadK>(acc_s, tSrQ, tSrK, tSsQ, tSrQ_view,
                                     smem_thr_copy_k.partition_S(sK), tSrK_view, tiled_mma,
                                     smem_copy_q, smem_copy_k);
    Tensor acc_s_rc = rowcol_view(acc_s);
    if (ScoreHook::of(params).active()) {  // uniform: softcap and ALiBi, before the mask
      const ScoreHook hook = ScoreHook::of(params);
      hook.apply(acc_s_rc, score_offsets_rc, thread_row, n_block * kBlockN + thread_col,
                 seq.mask(params).offset(), hook.alibi_slope(batch, head));
    }
    if constexpr (decltype(masked)::value)
      seq.mask(params).apply(acc_s_rc, score_offsets_rc, thread_row, n_block * kBlockN + thread_col);
    softmax.update(acc_s_rc, acc_o_rc);
    // Dropout after the row sums took every weight (the LSE is dropout's); the kept weights'
    // 1 / (1 - p) waits for the output's normalization. Warps split the rows only, so each
    // thread holds whole groups of dropout.h's bits.
    if (params.dropout_threshold != 0) keep.apply(acc_s_rc);  // uniform

    Tensor scores_a = make_tensor(acc_s.data(), acc_to_a_operand_layout(acc_s.layout()));
    gemm_pv<Element>(acc_o, scores_a, tOrVt, smem_thr_copy_v.partition_S(sVt), tOrVt_view,
                     tiled_mma, smem_copy_v);
    stage = stage + 1 == kStages ? 0 : stage + 1;
  };

  // Masked blocks on the right edge, the unmasked bulk, then (second pass) masked blocks on
  // the left edge: one call site per variant, so both stay inlined (a lambda left out of line
  // would put the by-reference accumulators in local memory).
  for (int masked_end = cute::max(n_begin, range.n_unmasked); n >= n_begin; masked_end = n_begin) {
    for (; n >= masked_end; --n) process_block(n, cute::true_type{});
    for (; n >= n_begin && n >= range.n_unmasked_begin; --n) process_block(n, cute::false_type{});
  }

  // Epilogue: normalize, stage O through shared memory for 16-byte row stores, write LSE.
  float lse[kRows];
  softmax.finalize(acc_o_rc, lse, params.dropout_rescale);  // 1 without dropout
  if (split_kv.splits > 1) {  // uniform: this split's part, in fp32 for merge_states.h
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // The merge may launch once every CTA is here (it waits for the parts in its kernel).
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    store_split_part<TileQ>(params, acc_o_rc, lse, thr_mma, packed, seq, batch, head, split, row0, seqlen_q);
    return;
  }
  Tensor o = convert_fragment<Element>(acc_o);
  cp_async_wait<0>();
  __syncthreads();  // O reuses Q's smem, which may have been a K/V stage

  Tensor sO = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutO{});
  auto smem_copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_copy_o = smem_copy_o.get_thread_slice(tid);
  copy(smem_copy_o, smem_thr_copy_o.retile_S(o), smem_thr_copy_o.partition_D(sO));

  if (params.lse != nullptr && tid % 4 == 0) {
    float* lse_base = params.lse + batch * params.lse_batch_stride + head * params.lse_head_stride + seq.q_start;
    Tensor tOcO = thr_mma.partition_C(make_identity_tensor(TileQ{}));
    Tensor tOcO_rc = make_tensor(tOcO.data(), rowcol_layout(tOcO.layout()));
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = row0 + get<0>(tOcO_rc(r, 0));
      if (row >= seqlen_q) continue;
      if (packed.packed())  // uniform; lse_base's head is then the group's first query head
        params.lse[batch * params.lse_batch_stride + packed.head_of(head, row) * params.lse_head_stride + seq.q_start +
                   packed.row_of(row)] = lse[r];
      else
        lse_base[row] = lse[r];
    }
  }
  __syncthreads();

  Element* o_base = static_cast<Element*>(params.out) + batch * params.out_batch_stride +
                    head * params.out_head_stride + int64_t(seq.q_start + row0) * params.out_row_stride;
  Tensor gO = make_tensor(make_gmem_ptr(o_base), TileQ{}, make_stride(params.out_row_stride, _1{}));
  typename Traits::GmemTiledCopyStore gmem_copy_o;
  auto gmem_thr_copy_o = gmem_copy_o.get_thread_slice(tid);
  Tensor tOsO = gmem_thr_copy_o.partition_S(sO);
  Tensor tOgO = gmem_thr_copy_o.partition_D(gO);
  Tensor tOrO = make_fragment_like(tOsO);
  copy(gmem_copy_o, tOsO, tOrO);
  Tensor tOcO = gmem_thr_copy_o.partition_D(make_identity_tensor(TileQ{}));
  if (packed.packed()) {  // uniform: rows of the group's heads
    Element* o_group = static_cast<Element*>(params.out) + batch * params.out_batch_stride +
                       int64_t(packed.head_of(head, 0)) * params.out_head_stride + int64_t(seq.q_start) * params.out_row_stride;
    Tensor tOgO0 = gmem_thr_copy_o.partition_D(make_tensor(make_gmem_ptr(o_group), TileQ{}, make_stride(Int<0>{}, _1{})));
    scatter_tile(gmem_copy_o, tOrO, tOgO0, tOcO, seqlen_q - row0, params.headdim, [&](int r, int) {
      return packed.offset(row0 + r, params.out_row_stride, params.out_head_stride);
    });
    return;
  }
  if (partial_cols) {
    store_tile_cols(gmem_copy_o, tOrO, tOgO, tOcO, seqlen_q - row0, params.headdim);
    return;
  }
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tOgO); ++m) {
    if (row0 + get<0>(tOcO(0, m, 0)) < seqlen_q) copy(gmem_copy_o, tOrO(_, m, _), tOgO(_, m, _));
  }
}

// The wide tile's kernel symbol per (dtype, head dim); its tile shapes follow the code
// generation it was compiled for (see fwd_config.h).
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(
    FwdTraitsFor<Element, kHeadDim, FLASHCUTE_AMPERE_TILE_ARCH>::type::kNThreads, 1)
    fwd_kernel(__grid_constant__ const FwdKernelParams params) {
#if defined(__CUDA_ARCH__)
  if constexpr (compiled_for<kHeadDim, FLASHCUTE_AMPERE_TILE_ARCH>())
    fwd_block<typename FwdTraitsFor<Element, kHeadDim, FLASHCUTE_AMPERE_TILE_ARCH>::type>(params);
#endif
}

// The narrow tile's symbol (fwd_config.h): its body only in sm90 code, the one launched with it.
template <class Element, int kHeadDim>
__global__ void __launch_bounds__(FwdNarrowTraitsFor<Element, kHeadDim>::type::kNThreads, 1)
    fwd_narrow_kernel(__grid_constant__ const FwdKernelParams params) {
#if defined(__CUDA_ARCH__) && FLASHCUTE_AMPERE_TILE_ARCH == 90
  if constexpr (compiled_for<kHeadDim, 90>()) fwd_block<typename FwdNarrowTraitsFor<Element, kHeadDim>::type>(params);
#endif
}

}  // namespace flashcute::ampere
