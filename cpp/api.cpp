// Public entry points: argument checks, device selection and dispatch to a compiled kernel.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "build_config.h"
#include "bwd_workspace.h"
#include "device_guard.h"
#include "flashcute/flashcute.h"
#include "hopper/fwd_split_plan.h"
#include "kernel_params.h"
#include "kernel_registry.h"
#include "kv_append_launch.h"
#include "kv_gather_launch.h"
#include "kvcache_plan.h"
#include "launch_status.h"
#include "merge_states_launch.h"
#include "operand_checks.h"

namespace flashcute {

namespace {

// V's head dim (and out's, dout's, dv's): headdim_v, or headdim where it is 0.
template <class Params>
int64_t v_headdim(const Params& p) {
  return p.headdim_v == 0 ? p.headdim : p.headdim_v;
}

// What the dispatch policy reads of a call.
template <class Params>
KernelQuery query_of(const Params& p) {
  KernelQuery q;
  q.headdim = p.headdim;
  q.headdim_v = v_headdim(p);
  q.dtype = p.dtype;
  if constexpr (std::is_same_v<Params, AttentionBackwardParams>) q.backward = true, q.deterministic = p.deterministic;
  return q;
}

// The compiled kernel head dims (d, dv) that run a call on `backend` on a GPU of `capability`
// ({0, 0}: none).
template <class Params>
std::pair<int, int> kernel_dims(const Params& p, Backend backend, int capability) {
  const KernelQuery q = query_of(p);
  auto clamp = [](int64_t d) { return static_cast<int>(std::min<int64_t>(std::max<int64_t>(d, -1), 1 << 20)); };
  return kernel_head_dims(compiled_kernels(capability), backend, clamp(q.headdim), clamp(q.headdim_v), q.backward);
}

Status invalid(const char* msg) { return make_status(StatusCode::kInvalidArgument, "%s", msg); }

// Whether the call has variable-length sequences (seq_view.h): packed rows or used key prefixes.
template <class Params>
bool varlen(const Params& p) {
  return p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr || p.seqused_k != nullptr;
}

// The sizes of a variable-length call (the offsets themselves are device data, not read here):
// at least one sequence, and packed row counts whose offsets, plus a tile's overhang past the
// longest sequence, fit the kernels' 32-bit row indices.
template <class Params>
Status check_varlen(const Params& p) {
  if (!varlen(p)) return Status{};
  if (p.batch < 1)
    return make_status(StatusCode::kInvalidArgument,
                       "batch: expected at least 1 sequence with cu_seqlens_q, cu_seqlens_k or seqused_k, "
                       "got %lld",
                       static_cast<long long>(p.batch));
  constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max() - 256;
  const struct {
    const char* name;
    const int32_t* cu_seqlens;
    int64_t total, max_seqlen;
  } sides[] = {{"total_q", p.cu_seqlens_q, p.total_q, p.seqlen_q}, {"total_k", p.cu_seqlens_k, p.total_k, p.seqlen_k}};
  for (const auto& side : sides) {
    if (side.cu_seqlens == nullptr) continue;
    if (side.total < 0)
      return make_status(StatusCode::kInvalidArgument, "%s: expected the packed tensors' rows (>= 0), got %lld",
                         side.name, static_cast<long long>(side.total));
    if (side.total > kMaxRows - side.max_seqlen)
      return make_status(StatusCode::kInvalidArgument,
                         "%s: %lld rows plus the longest sequence (%lld) must fit in 32 bits",
                         side.name, static_cast<long long>(side.total), static_cast<long long>(side.max_seqlen));
  }
  return Status{};
}

// The params a variable-length call runs with: the longest sequence of a packed side can be no
// longer than its rows (seq_view.h clamps every range to them), which bounds the grid and the
// backward's workspace rows without changing any result.
template <class Params>
Params bounded(Params p) {
  if (p.cu_seqlens_q != nullptr) p.seqlen_q = std::min(p.seqlen_q, std::max<int64_t>(p.total_q, 0));
  if (p.cu_seqlens_k != nullptr) p.seqlen_k = std::min(p.seqlen_k, std::max<int64_t>(p.total_k, 0));
  return p;
}

// Sizes, dtype, scale, window, softcap and ALiBi's stride: the checks the forward and the
// backward share (also for workspace-size queries, which pass no pointers).
template <class Params>
Status check_problem(const Params& p) {
  if (varlen(p) && (p.seqlen_q < 0 || p.seqlen_k < 0))
    return make_status(StatusCode::kInvalidArgument,
                       "seqlen_q, seqlen_k: expected the longest sequences' lengths (max_seqlen_q, "
                       "max_seqlen_k, >= 0), got %lld and %lld",
                       static_cast<long long>(p.seqlen_q), static_cast<long long>(p.seqlen_k));
  if (p.batch < 0 || p.seqlen_q < 0 || p.seqlen_k < 0 || p.nheads < 0 || p.nheads_kv < 0 || p.headdim <= 0)
    return invalid("sizes must be non-negative and headdim positive");
  if (p.headdim_v < 0) return invalid("headdim_v: expected 0 (v's head dim is headdim) or a positive head dim");
  constexpr bool kForward = std::is_same_v<Params, AttentionForwardParams>;
  if (p.dtype == DType::kFloat8E4M3 && !kForward)
    return invalid("dtype: float8_e4m3fn has no backward (FP8 is forward-only)");
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat8E4M3)
    return invalid(kForward ? "dtype: expected float16, bfloat16 or float8_e4m3fn" : "dtype: expected float16 or bfloat16");
  if (p.nheads_kv == 0 ? p.nheads != 0 : p.nheads % p.nheads_kv != 0)
    return make_status(StatusCode::kInvalidArgument,
                       "nheads (%lld) must be a multiple of nheads_kv (%lld)",
                       static_cast<long long>(p.nheads), static_cast<long long>(p.nheads_kv));
  // The kernels multiply the scale by log2(e): both must be normal, finite float32 numbers.
  if (!(p.softmax_scale >= std::numeric_limits<float>::min()) ||
      !std::isfinite(p.softmax_scale * 1.4426950408889634f))
    return invalid("softmax_scale: expected a finite positive float32 whose product with log2(e) is "
                   "finite and normal");
  constexpr int64_t kMaxGrid = 65535;
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  if (p.batch > kMaxGrid || p.nheads > kMaxGrid)
    return make_status(StatusCode::kNotSupported, "batch and nheads must be at most %lld", kMaxGrid);
  if (p.seqlen_q + p.seqlen_k > kMaxInt - 256)
    return invalid("seqlen_q + seqlen_k must fit in 32 bits");
  if (Status s = check_varlen(p); !s.ok()) return s;
  if (p.window_left < -1) return invalid("window_left: expected -1 (unbounded) or a value >= 0");
  if (p.window_right < -1) return invalid("window_right: expected -1 (unbounded) or a value >= 0");
  // The score hook runs softcap / softmax_scale and its inverse in float32.
  if (!(p.softcap >= 0.f) || !std::isfinite(p.softcap) ||
      (p.softcap > 0.f && !(std::isfinite(p.softcap / p.softmax_scale) &&
                            p.softmax_scale / p.softcap >= std::numeric_limits<float>::min())))
    return invalid("softcap: expected 0 or a finite positive float32 within 2^126 of softmax_scale");
  if (p.alibi_slopes_batch_stride < 0)
    return invalid("alibi_slopes_batch_stride: expected a value >= 0 (0: one row of slopes for every batch)");
  if (!(p.dropout_p >= 0.f && p.dropout_p < 1.f)) return invalid("dropout_p: expected a value in [0, 1)");
  if (reinterpret_cast<uintptr_t>(p.dropout_rng_state) % alignof(int64_t) != 0)
    return invalid("dropout_rng_state: expected an 8-byte aligned int64 device pointer");
  return Status{};
}

// ALiBi's slopes as an operand: nheads float32 values per batch row (one row with a batch
// stride of 0), an input of the kernels.
template <class Params>
Operand alibi_operand(const Params& p) {
  const int64_t rows = p.alibi_slopes_batch_stride == 0 ? 1 : p.batch;
  return Operand{"alibi_slopes", p.alibi_slopes, 2, {rows, p.nheads, 1, 1},
                 {p.alibi_slopes_batch_stride, 1, 1, 1}, 4,
                 p.alibi_slopes != nullptr && rows > 0 && p.nheads > 0};
}

// The slopes' pointer: none, or a 4-byte aligned one; a batch stride without slopes is a
// caller's mistake, not "off".
template <class Params>
Status check_alibi(const Params& p) {
  if (p.alibi_slopes == nullptr && p.alibi_slopes_batch_stride != 0)
    return make_status(StatusCode::kInvalidArgument,
                       "alibi_slopes: null, but alibi_slopes_batch_stride is %lld; pass the slopes "
                       "or a batch stride of 0",
                       static_cast<long long>(p.alibi_slopes_batch_stride));
  if (reinterpret_cast<uintptr_t>(p.alibi_slopes) % alignof(float) != 0)
    return invalid("alibi_slopes: expected a 4-byte aligned float32 device pointer");
  return Status{};
}

// A packed side (cu_seqlens) is one (1, total, heads, headdim) tensor whose batch stride is
// ignored; a batched side is (batch, seqlen, heads, headdim).
struct Rows {
  int64_t batch, rows;
  bool packed;
  int64_t batch_stride(int64_t given) const { return packed ? 0 : given; }
};
template <class Params>
Rows q_rows(const Params& p) {
  return p.cu_seqlens_q != nullptr ? Rows{1, p.total_q, true} : Rows{p.batch, p.seqlen_q, false};
}
template <class Params>
Rows k_rows(const Params& p) {
  return p.cu_seqlens_k != nullptr ? Rows{1, p.total_k, true} : Rows{p.batch, p.seqlen_k, false};
}

static_assert(kFp8Block == kFp8DescaleBlock, "the kernels' descale block is the public one");

bool is_fp8(const AttentionForwardParams& p) { return p.dtype == DType::kFloat8E4M3; }

// FP8's descales: only with e4m3 inputs, 4-byte aligned, strides >= 0, K's and V's last block
// within 32 bits of their start, per head in variable-length batches; no dropout.
Status check_fp8(const AttentionForwardParams& p) {
  const bool any = p.q_descale != nullptr || p.k_descale != nullptr || p.v_descale != nullptr;
  if (!is_fp8(p)) {
    if (any) return invalid("q_descale, k_descale, v_descale: only float8_e4m3fn calls take descales");
    return Status{};
  }
  for (const float* d : {p.q_descale, p.k_descale, p.v_descale})
    if (reinterpret_cast<uintptr_t>(d) % alignof(float) != 0)
      return invalid("q_descale, k_descale, v_descale: expected 4-byte aligned float32 device pointers");
  for (int64_t stride : {p.q_descale_batch_stride, p.q_descale_head_stride, p.q_descale_block_stride,
                         p.k_descale_batch_stride, p.k_descale_head_stride, p.k_descale_block_stride,
                         p.v_descale_batch_stride, p.v_descale_head_stride, p.v_descale_block_stride})
    if (stride < 0) return invalid("q_descale, k_descale, v_descale: expected strides >= 0");
  if (varlen(p) && (p.q_descale_block_stride != 0 || p.k_descale_block_stride != 0 || p.v_descale_block_stride != 0))
    return invalid("q_descale, k_descale, v_descale: variable-length batches take per-head descales "
                   "(block strides of 0)");
  // The kernels address K's and V's block descales with 32-bit products (block · block stride).
  const int64_t last_k_block = (p.seqlen_k + kFp8DescaleBlock - 1) / kFp8DescaleBlock - 1;
  for (int64_t stride : {p.k_descale_block_stride, p.v_descale_block_stride})
    if (last_k_block > 0 && stride > std::numeric_limits<int32_t>::max() / last_k_block)
      return invalid("k_descale, v_descale: block stride too large (the last block's offset must fit in 32 bits)");
  if (p.dropout_p > 0.f) return invalid("dropout_p: float8_e4m3fn calls have no dropout");
  if (p.out_dtype != DType::kBFloat16 && p.out_dtype != DType::kFloat16)
    return invalid("out_dtype: expected bfloat16 or float16 for float8_e4m3fn inputs");
  return Status{};
}

// A descale as an operand: (batch, heads, blocks) float32 values.
Operand descale_operand(const char* name, const float* ptr, int64_t batch, int64_t heads, int64_t rows,
                        int64_t batch_stride, int64_t head_stride, int64_t block_stride) {
  const int64_t blocks = block_stride == 0 ? 1 : (rows + kFp8DescaleBlock - 1) / kFp8DescaleBlock;
  return Operand{name, ptr, 3, {batch, heads, blocks, 1}, {batch_stride, head_stride, block_stride, 1}, 4,
                 ptr != nullptr && batch > 0 && heads > 0 && blocks > 0};
}

Status check_forward(const AttentionForwardParams& p) {
  if (Status s = check_problem(p); !s.ok()) return s;
  if (Status s = check_fp8(p); !s.ok()) return s;
  const bool empty = p.batch == 0 || p.seqlen_q == 0 || p.nheads == 0;
  if (empty) return Status{};
  if (p.q == nullptr || p.out == nullptr || (p.seqlen_k > 0 && (p.k == nullptr || p.v == nullptr)))
    return invalid("q, k, v and out must not be null");
  if (Status s = check_alibi(p); !s.ok()) return s;
  const bool has_k = p.seqlen_k > 0;
  const Rows qr = q_rows(p), kr = k_rows(p);
  const int in_bytes = is_fp8(p) ? 1 : 2;
  const int64_t q_desc_heads = p.q_descale_per_kv_head ? p.nheads_kv : p.nheads;
  const Operand inputs[] = {
      tensor4("q", p.q, qr.batch, qr.rows, p.nheads, p.headdim, qr.batch_stride(p.q_batch_stride), p.q_row_stride,
              p.q_head_stride, in_bytes),
      tensor4("k", p.k, kr.batch, kr.rows, p.nheads_kv, p.headdim, kr.batch_stride(p.k_batch_stride),
              p.k_row_stride, p.k_head_stride, in_bytes, has_k),
      tensor4("v", p.v, kr.batch, kr.rows, p.nheads_kv, v_headdim(p), kr.batch_stride(p.v_batch_stride),
              p.v_row_stride, p.v_head_stride, in_bytes, has_k),
      alibi_operand(p),
      descale_operand("q_descale", p.q_descale, p.batch, q_desc_heads, p.seqlen_q, p.q_descale_batch_stride,
                      p.q_descale_head_stride, p.q_descale_block_stride),
      descale_operand("k_descale", p.k_descale, p.batch, p.nheads_kv, p.seqlen_k, p.k_descale_batch_stride,
                      p.k_descale_head_stride, p.k_descale_block_stride),
      descale_operand("v_descale", p.v_descale, p.batch, p.nheads_kv, p.seqlen_k, p.v_descale_batch_stride,
                      p.v_descale_head_stride, p.v_descale_block_stride),
  };
  const Operand outputs[] = {
      tensor4("out", p.out, qr.batch, qr.rows, p.nheads, v_headdim(p), qr.batch_stride(p.out_batch_stride),
              p.out_row_stride, p.out_head_stride, 2),
      lse_tensor("lse", p.lse, qr.batch, p.nheads, qr.rows, qr.batch_stride(p.lse_batch_stride),
                 p.lse_head_stride),
      bytes_buffer("workspace", p.workspace, p.workspace_bytes),
  };
  for (int i = 0; i < 3; ++i)  // q, k, v; the slopes and descales are read as single floats
    if (Status s = check_aligned16(inputs[i]); !s.ok()) return s;
  if (Status s = check_aligned16(outputs[0]); !s.ok()) return s;
  if (p.workspace != nullptr && reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0)
    return invalid("workspace: expected a 16-byte aligned device buffer");
  return check_no_overlap(outputs, inputs);
}

// Whether the mask bounds keys by more than seqlen_k (the causal diagonal or a window side that
// reaches into the sequence): per-tile work then varies (bwd_workspace.h, the launchers).
template <class Params>
bool requests_band(const Params& p) {
  return p.causal || p.window_right == 0 || (p.window_left >= 0 && p.window_left < p.seqlen_k) ||
         (p.window_right >= 0 && p.window_right < p.seqlen_q);
}

// The mask and score-hook fields the forward and backward kernels share (kernel_params.h).
template <class Kernel, class Params>
void set_mask_and_hook(Kernel& k, const Params& p) {
  auto clip = [](int64_t side, int64_t unbounded) { return side < 0 || side > unbounded ? unbounded : side; };
  k.window_left = static_cast<int>(clip(p.window_left, p.seqlen_k));
  k.window_right = p.causal ? 0 : static_cast<int>(clip(p.window_right, p.seqlen_q));
  // A window of (unbounded, 0) is the causal mask: it takes the causal schedules too.
  k.causal = p.causal || (k.window_right == 0 && k.window_left == p.seqlen_k);
  k.softcap_in = p.softcap > 0.f ? p.softmax_scale / p.softcap : 0.f;
  k.softcap_out = p.softcap > 0.f ? p.softcap / p.softmax_scale : 0.f;
  k.alibi_slopes = p.alibi_slopes;
  k.alibi_batch_stride = p.alibi_slopes == nullptr ? 0 : p.alibi_slopes_batch_stride;
  k.alibi_scale = -1.f / p.softmax_scale;
  // Dropout: p in 16-bit steps; a p that rounds to 0 keeps every weight, as p = 0 does.
  const double threshold = std::nearbyint(static_cast<double>(p.dropout_p) * 65536.0);
  k.dropout_threshold = static_cast<uint32_t>(std::min(threshold, 65535.0));
  k.dropout_rescale = k.dropout_threshold != 0 ? static_cast<float>(1.0 / (1.0 - static_cast<double>(p.dropout_p))) : 1.f;
  k.dropout_seed = p.dropout_seed;
  k.dropout_offset = p.dropout_offset;
  k.dropout_rng_state = k.dropout_threshold != 0 ? p.dropout_rng_state : nullptr;
}

// The sequence view's fields (seq_view.h); the packed row counts only with their offsets.
template <class Kernel, class Params>
void set_varlen(Kernel& k, const Params& p) {
  k.cu_seqlens_q = p.cu_seqlens_q;
  k.cu_seqlens_k = p.cu_seqlens_k;
  k.seqused_k = p.seqused_k;
  k.total_q = p.cu_seqlens_q != nullptr ? static_cast<int>(p.total_q) : 0;
  k.total_k = p.cu_seqlens_k != nullptr ? static_cast<int>(p.total_k) : 0;
}

FwdKernelParams kernel_params(const AttentionForwardParams& p) {
  FwdKernelParams k{};
  k.q = p.q, k.k = p.k, k.v = p.v, k.out = p.out, k.lse = p.lse;
  k.q_batch_stride = p.q_batch_stride, k.q_row_stride = p.q_row_stride, k.q_head_stride = p.q_head_stride;
  k.k_batch_stride = p.k_batch_stride, k.k_row_stride = p.k_row_stride, k.k_head_stride = p.k_head_stride;
  k.v_batch_stride = p.v_batch_stride, k.v_row_stride = p.v_row_stride, k.v_head_stride = p.v_head_stride;
  k.out_batch_stride = p.out_batch_stride, k.out_row_stride = p.out_row_stride;
  k.out_head_stride = p.out_head_stride;
  k.lse_batch_stride = p.lse_batch_stride, k.lse_head_stride = p.lse_head_stride;
  if (p.cu_seqlens_q != nullptr) k.q_batch_stride = k.out_batch_stride = k.lse_batch_stride = 0;
  if (p.cu_seqlens_k != nullptr) k.k_batch_stride = k.v_batch_stride = 0;
  k.batch = static_cast<int>(p.batch);
  k.seqlen_q = static_cast<int>(p.seqlen_q);
  k.seqlen_k = static_cast<int>(p.seqlen_k);
  k.nheads = static_cast<int>(p.nheads);
  k.heads_per_kv = static_cast<int>(p.nheads / p.nheads_kv);
  k.headdim = static_cast<int>(p.headdim);
  k.headdim_v = static_cast<int>(v_headdim(p));
  k.softmax_scale = p.softmax_scale;
  k.scale_log2 = p.softmax_scale * 1.4426950408889634f;
  k.causal = p.causal;
  set_mask_and_hook(k, p);
  set_varlen(k, p);
  k.q_descale = p.q_descale, k.k_descale = p.k_descale, k.v_descale = p.v_descale;
  k.q_descale_batch_stride = p.q_descale_batch_stride, k.q_descale_head_stride = p.q_descale_head_stride;
  k.q_descale_block_stride = p.q_descale_block_stride;
  k.k_descale_batch_stride = p.k_descale_batch_stride, k.k_descale_head_stride = p.k_descale_head_stride;
  k.k_descale_block_stride = p.k_descale_block_stride;
  k.v_descale_batch_stride = p.v_descale_batch_stride, k.v_descale_head_stride = p.v_descale_head_stride;
  k.v_descale_block_stride = p.v_descale_block_stride;
  k.q_descale_head_div = p.q_descale_per_kv_head ? k.heads_per_kv : 1;
  k.out_fp16 = is_fp8(p) && p.out_dtype == DType::kFloat16;
  // Variable-length calls never split (their tiles' work differs per sequence). They, and
  // windows with a left side, claim their tiles through the workspace's first int where it has
  // one (hopper/fwd_split_plan.h).
  k.workspace = varlen(p) ? nullptr : p.workspace;
  k.workspace_bytes = k.workspace == nullptr ? 0 : p.workspace_bytes;
  if ((varlen(p) || hopper::fwd_windowed(k)) && p.workspace != nullptr && p.workspace_bytes >= hopper::kFwdClaimBytes)
    k.tile_claims = static_cast<int*>(p.workspace);
  return k;
}

// The head dim of the backward kernel a call runs on: the call's, or the wider of its two head
// dims where V's differs (the Hopper path then runs it on a kernel at least as wide as both).
int64_t bwd_call_headdim(const AttentionBackwardParams& p) { return std::max(p.headdim, v_headdim(p)); }

// The backward's workspace for the path that runs it (bwd_workspace.h): both paths add dQ
// into an fp32 accumulator, except the Ampere path's deterministic design. Its rows are as
// wide as the kernel's head dim (the call's rounded up).
BwdWorkspace workspace_layout(const AttentionBackwardParams& p, Backend resolved, int capability) {
  const bool hopper = resolved == Backend::kHopper;
  const int kernel_headdim = kernel_dims(p, resolved, capability).first;
  return bwd_workspace(p.batch, p.nheads, p.nheads_kv, p.seqlen_q, p.seqlen_k,
                       kernel_headdim > 0 ? kernel_headdim : bwd_call_headdim(p),
                       /*lse_log2=*/hopper, /*dq_accum=*/hopper || !p.deterministic, /*dq_ready=*/hopper,
                       /*tail_split=*/hopper && !varlen(p) && hopper_bwd_tail_split(requests_band(p)));
}

Status check_backward(const AttentionBackwardParams& p) {
  if (Status s = check_problem(p); !s.ok()) return s;
  if (p.batch == 0 || p.nheads == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0)) return Status{};
  const bool has_q = p.seqlen_q > 0, has_k = p.seqlen_k > 0;
  if ((has_q && (p.q == nullptr || p.dout == nullptr || p.out == nullptr || p.lse == nullptr ||
                 p.dq == nullptr)) ||
      (has_k && (p.k == nullptr || p.v == nullptr || p.dk == nullptr || p.dv == nullptr)))
    return invalid("dout, q, k, v, out, lse, dq, dk and dv must not be null");
  if (Status s = check_alibi(p); !s.ok()) return s;
  const Rows qr = q_rows(p), kr = k_rows(p);
  // q-like and k-like tensors of headdim columns, or of V's head dim (out, dout; v, dv)
  const int64_t hd = p.headdim, hdv = v_headdim(p);
  auto q_like = [&](const char* name, const void* ptr, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                    int64_t cols) {
    return tensor4(name, ptr, qr.batch, qr.rows, p.nheads, cols, qr.batch_stride(batch_stride), row_stride,
                   head_stride, 2, has_q);
  };
  auto k_like = [&](const char* name, const void* ptr, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                    int64_t cols) {
    return tensor4(name, ptr, kr.batch, kr.rows, p.nheads_kv, cols, kr.batch_stride(batch_stride), row_stride,
                   head_stride, 2, has_k);
  };
  const Operand inputs[] = {
      q_like("dout", p.dout, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride, hdv),
      q_like("q", p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, hd),
      k_like("k", p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, hd),
      k_like("v", p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, hdv),
      q_like("out", p.out, p.out_batch_stride, p.out_row_stride, p.out_head_stride, hdv),
      lse_tensor("lse", p.lse, qr.batch, p.nheads, qr.rows, qr.batch_stride(p.lse_batch_stride), p.lse_head_stride,
                 has_q),
      alibi_operand(p),
  };
  const Operand outputs[] = {
      q_like("dq", p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, hd),
      k_like("dk", p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, hd),
      k_like("dv", p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, hdv),
      bytes_buffer("workspace", p.workspace, p.workspace_bytes),
  };
  for (const Operand& o : inputs)  // lse and the slopes are read as single floats
    if (o.elem_bytes == 2)
      if (Status s = check_aligned16(o); !s.ok()) return s;
  for (int i = 0; i < 3; ++i)  // dq, dk, dv; the workspace is checked with its layout
    if (Status s = check_aligned16(outputs[i]); !s.ok()) return s;
  return check_no_overlap(outputs, inputs);
}

// The workspace, once the path that runs the call (and so its layout) is known.
Status check_workspace(const AttentionBackwardParams& p, Backend resolved, int capability) {
  if (p.batch == 0 || p.nheads == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0)) return Status{};
  const size_t needed = workspace_layout(p, resolved, capability).bytes;
  if (needed > 0 && (p.workspace == nullptr || reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0))
    return invalid("workspace: expected a 16-byte aligned device buffer");
  if (p.workspace_bytes < needed)
    return make_status(StatusCode::kInvalidArgument,
                       "workspace: %zu bytes given, attention_backward_workspace_size() asks for %zu",
                       p.workspace_bytes, needed);
  return Status{};
}

BwdKernelParams kernel_params(const AttentionBackwardParams& p, Backend resolved, int capability) {
  BwdKernelParams k{};
  k.q = p.q, k.k = p.k, k.v = p.v, k.out = p.out, k.dout = p.dout, k.lse = p.lse;
  k.dq = p.dq, k.dk = p.dk, k.dv = p.dv;
  const BwdWorkspace workspace = workspace_layout(p, resolved, capability);
  char* base = static_cast<char*>(p.workspace);
  k.seqlen_q_padded = static_cast<int>(workspace.rows_padded);
  k.row_dot = reinterpret_cast<float*>(base + workspace.row_dot_offset);
  if (workspace.has_lse_log2) k.lse_log2 = reinterpret_cast<float*>(base + workspace.lse_log2_offset);
  if (workspace.has_dq_accum) k.dq_accum = reinterpret_cast<float*>(base + workspace.dq_accum_offset);
  if (workspace.has_dq_ready) k.dq_ready = reinterpret_cast<int*>(base + workspace.dq_ready_offset);
  if (workspace.split_tiles > 0) {
    k.split_done = reinterpret_cast<int*>(base + workspace.split_done_offset);
    k.dkv_accum = reinterpret_cast<float*>(base + workspace.dkv_accum_offset);
    k.split_tiles_max = static_cast<int>(workspace.split_tiles);
  }
  k.q_batch_stride = p.q_batch_stride, k.q_row_stride = p.q_row_stride, k.q_head_stride = p.q_head_stride;
  k.k_batch_stride = p.k_batch_stride, k.k_row_stride = p.k_row_stride, k.k_head_stride = p.k_head_stride;
  k.v_batch_stride = p.v_batch_stride, k.v_row_stride = p.v_row_stride, k.v_head_stride = p.v_head_stride;
  k.out_batch_stride = p.out_batch_stride, k.out_row_stride = p.out_row_stride;
  k.out_head_stride = p.out_head_stride;
  k.dout_batch_stride = p.dout_batch_stride, k.dout_row_stride = p.dout_row_stride;
  k.dout_head_stride = p.dout_head_stride;
  k.dq_batch_stride = p.dq_batch_stride, k.dq_row_stride = p.dq_row_stride, k.dq_head_stride = p.dq_head_stride;
  k.dk_batch_stride = p.dk_batch_stride, k.dk_row_stride = p.dk_row_stride, k.dk_head_stride = p.dk_head_stride;
  k.dv_batch_stride = p.dv_batch_stride, k.dv_row_stride = p.dv_row_stride, k.dv_head_stride = p.dv_head_stride;
  k.lse_batch_stride = p.lse_batch_stride, k.lse_head_stride = p.lse_head_stride;
  if (p.cu_seqlens_q != nullptr)
    k.q_batch_stride = k.out_batch_stride = k.dout_batch_stride = k.dq_batch_stride = k.lse_batch_stride = 0;
  if (p.cu_seqlens_k != nullptr) k.k_batch_stride = k.v_batch_stride = k.dk_batch_stride = k.dv_batch_stride = 0;
  set_varlen(k, p);
  k.batch = static_cast<int>(p.batch);
  k.seqlen_q = static_cast<int>(p.seqlen_q);
  k.seqlen_k = static_cast<int>(p.seqlen_k);
  k.nheads = static_cast<int>(p.nheads);
  k.nheads_kv = static_cast<int>(p.nheads_kv);
  k.headdim = static_cast<int>(p.headdim);
  k.headdim_v = static_cast<int>(v_headdim(p));
  k.heads_per_kv = static_cast<int>(p.nheads / p.nheads_kv);
  k.softmax_scale = p.softmax_scale;
  k.scale_log2 = p.softmax_scale * 1.4426950408889634f;
  k.causal = p.causal;
  set_mask_and_hook(k, p);
  return k;
}


}  // namespace

Status device_capability(int device, int* capability) {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    return make_status(StatusCode::kNoDevice, "no usable CUDA driver or GPU: %s (%s)",
                       cudaGetErrorName(err), cudaGetErrorString(err));
  }
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) device = 0;
  if (device >= count)
    return make_status(StatusCode::kNoDevice, "CUDA device %d does not exist (%d visible)", device, count);
  int major = 0, minor = 0;
  if (cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device); err != cudaSuccess)
    return cuda_status(err, "cudaDeviceGetAttribute");
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  *capability = major * 10 + minor;
  return Status{};
}

Status synchronize_stream(int device, cudaStream_t stream) {
  DeviceGuard guard(device);
  if (!guard.status().ok()) return guard.status();
  return cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

Status choose_kernel(const KernelQuery& query, Backend backend, int capability, KernelChoice* choice) {
  if (choice == nullptr) return invalid("choice must not be null");
  return choose_kernel_in(compiled_kernels(capability), query, backend, capability, choice);
}

Backend default_backend(int capability) { return default_backend_of(compiled_kernels(capability), capability); }

namespace {

// The path a workspace query sizes for: the one named, or with kAuto the policy's choice on this
// capability (dispatch_policy.h).
template <class Params>
Status resolve_backend(const Params& params, Backend backend, int capability, Backend* resolved) {
  if (backend != Backend::kAuto) {
    *resolved = backend;
    return Status{};
  }
  KernelChoice choice;
  if (Status s = choose_kernel(query_of(params), Backend::kAuto, capability, &choice); !s.ok()) return s;
  *resolved = choice.backend;
  return Status{};
}

// The launcher of the kernel that runs the request on this device (dispatch_policy.h).
template <class Params, class Launcher>
Status find_launcher(const Params& params, Backend backend, Launcher* launcher, Backend* resolved,
                     int* capability_out = nullptr) {
  int capability = 0;
  if (Status s = device_capability(params.device, &capability); !s.ok()) return s;
  if (capability_out != nullptr) *capability_out = capability;
  KernelChoice choice;
  if (Status s = choose_kernel(query_of(params), backend, capability, &choice); !s.ok()) return s;
  *resolved = choice.backend;
  if constexpr (std::is_same_v<Launcher, FwdLauncher>) {
    *launcher = find_fwd_launcher(choice.backend, params.dtype, choice.headdim, choice.headdim_v);
  } else {
    *launcher = find_bwd_launcher(choice.backend, params.dtype, choice.headdim);
  }
  if (*launcher == nullptr)  // the catalogue and the launchers come from the same lists
    return make_status(StatusCode::kNotSupported, "no launcher for the chosen kernel (head dims %d, %d)",
                       choice.headdim, choice.headdim_v);
  return Status{};
}

}  // namespace

Status attention_forward(const AttentionForwardParams& given, Backend backend) {
  const AttentionForwardParams params = bounded(given);
  if (Status s = check_forward(params); !s.ok()) return s;
  if (params.batch == 0 || params.seqlen_q == 0 || params.nheads == 0) return Status{};
  FwdLauncher launch = nullptr;
  Backend resolved = backend;
  if (Status s = find_launcher(params, backend, &launch, &resolved); !s.ok())
    return s;
  DeviceGuard guard(params.device);
  if (!guard.status().ok()) return guard.status();
  return launch(kernel_params(params), params.stream);
}

Status attention_forward_workspace_size(const AttentionForwardParams& given, size_t* bytes, Backend backend) {
  if (bytes == nullptr) return invalid("bytes must not be null");
  *bytes = 0;
  const AttentionForwardParams params = bounded(given);
  if (Status s = check_problem(params); !s.ok()) return s;
  if (params.batch == 0 || params.seqlen_q == 0 || params.nheads == 0) return Status{};  // launches nothing
  if (is_fp8(params)) return Status{};  // FP8 calls never split and keep the fixed tile order
  // Only the Hopper path splits its last wave, and only on a device that runs it.
  int capability = 0;
  if (backend == Backend::kAmpere || !device_capability(params.device, &capability).ok()) return Status{};
  Backend resolved = backend;
  if (Status s = resolve_backend(params, backend, capability, &resolved); !s.ok()) return s;
  // The split's tiles and state follow the kernel's head dims (a pair kernel's where V's differs).
  const auto kernel = kernel_dims(params, Backend::kHopper, 90);
  const int kernel_headdim = kernel.first, kernel_headdim_v = kernel.second;
  if (resolved != Backend::kHopper || capability != 90 || kernel_headdim == 0) return Status{};
  if (varlen(params)) {  // never split; the counter of the claimed tile order
    *bytes = hopper::kFwdClaimBytes;
    return Status{};
  }
  int device = params.device;
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) return Status{};
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return Status{};
  const FwdKernelParams call = kernel_params(params);
  *bytes = std::max(hopper::plan_fwd_split(call, kernel_headdim, sms, kernel_headdim_v).workspace.bytes,
                    hopper::fwd_claim_bytes(call, kernel_headdim, sms));
  return Status{};
}

Status attention_backward_workspace_size(const AttentionBackwardParams& given, size_t* bytes,
                                         Backend backend) {
  if (bytes == nullptr) return invalid("bytes must not be null");
  const AttentionBackwardParams params = bounded(given);
  if (Status s = check_problem(params); !s.ok()) return s;
  const bool hopper_kernel = kernel_dims(params, Backend::kHopper, 90).first > 0;
  // kAuto follows the device; without a usable device, the largest layout of both paths as
  // sm80 and sm90 code (their kernels' head dims may differ).
  int capability = 0;
  if (!device_capability(params.device, &capability).ok()) {
    if (backend != Backend::kHopper || !hopper_kernel)
      *bytes = std::max(workspace_layout(params, Backend::kAmpere, 80).bytes,
                        workspace_layout(params, Backend::kAmpere, 90).bytes);
    if (hopper_kernel && backend != Backend::kAmpere)
      *bytes = std::max(*bytes, workspace_layout(params, Backend::kHopper, 90).bytes);
    return Status{};
  }
  Backend resolved = backend;
  if (Status s = resolve_backend(params, backend, capability, &resolved); !s.ok()) return s;
  if (resolved == Backend::kHopper && !hopper_kernel) resolved = Backend::kAmpere;
  *bytes = workspace_layout(params, resolved, capability).bytes;
  return Status{};
}

Status attention_backward(const AttentionBackwardParams& given, Backend backend) {
  const AttentionBackwardParams params = bounded(given);
  if (Status s = check_backward(params); !s.ok()) return s;
  if (params.batch == 0 || params.nheads == 0 || (params.seqlen_q == 0 && params.seqlen_k == 0))
    return Status{};
  BwdLauncher launch = nullptr;
  Backend resolved = backend;
  int capability = 0;
  if (Status s = find_launcher(params, backend, &launch, &resolved, &capability); !s.ok())
    return s;
  if (Status s = check_workspace(params, resolved, capability); !s.ok()) return s;
  DeviceGuard guard(params.device);
  if (!guard.status().ok()) return guard.status();
  return launch(kernel_params(params, resolved, capability), params.stream);
}

namespace {

// The forward params a KV-cache call runs with: the cache's sequence lengths as seqused_k (the
// appended keys come on top in the kernel params), a paged cache's capacity as seqlen_k.
AttentionForwardParams cache_view(const AttentionForwardParams& given, const KVCacheParams& c) {
  AttentionForwardParams p = given;
  p.seqused_k = c.cache_seqlens;
  if (c.page_table != nullptr) p.seqlen_k = c.max_pages * c.page_size;
  return bounded(p);
}

Status check_kvcache(const AttentionForwardParams& given, const KVCacheParams& c) {
  if (given.cu_seqlens_k != nullptr || given.seqused_k != nullptr)
    return invalid("cu_seqlens_k, seqused_k: a KV-cache call takes the cache's lengths as cache_seqlens");
  if (given.dropout_p != 0.f) return invalid("dropout_p: KV-cache calls run without dropout (expected 0)");
  if (c.cache_seqlens == nullptr) return invalid("cache_seqlens: expected a device int32 (batch,) tensor, got null");
  const bool paged = c.page_table != nullptr;
  if (paged) {
    if (c.page_size < 1) return invalid("page_size: expected at least 1");
    if (c.num_pages < 1) return invalid("num_pages: expected at least 1 page in the cache");
    if (c.max_pages < 1) return invalid("page_table: expected at least one column (max_pages >= 1)");
    if (c.page_table_batch_stride < 0) return invalid("page_table: expected a non-negative batch stride");
    if (c.max_pages > (std::numeric_limits<int32_t>::max() - 256 - given.seqlen_q) / c.page_size)
      return invalid("page_table: max_pages * page_size keys must fit in 32 bits");
    if (c.num_pages > std::numeric_limits<int32_t>::max()) return invalid("num_pages: at most 2^31 - 1 pages");
    // The paged loads address a row with 32-bit page and in-page offsets (kv_rows.h).
    constexpr int64_t kMax32 = std::numeric_limits<uint32_t>::max();
    const struct { const char* name; int64_t page_stride, row_stride; } caches[] = {
        {"k_cache", given.k_batch_stride, given.k_row_stride}, {"v_cache", given.v_batch_stride, given.v_row_stride}};
    for (const auto& t : caches)
      if (t.page_stride < 0 || t.page_stride > kMax32 || t.row_stride < 0 || t.row_stride > kMax32 / c.page_size)
        return make_status(StatusCode::kInvalidArgument,
                           "%s: a page must span fewer than 2^32 elements (page stride %lld, row stride %lld)", t.name,
                           static_cast<long long>(t.page_stride), static_cast<long long>(t.row_stride));
  }
  if (c.seqlen_new < 0) return invalid("k_new: expected seqlen_new >= 0");
  if (c.seqlen_new > 0 && (c.k_new == nullptr || c.v_new == nullptr))
    return invalid("k_new, v_new: expected both tensors with seqlen_new > 0");
  if (c.seqlen_new > 0 && given.cu_seqlens_q != nullptr)
    return invalid("k_new: appends need a batched q; with cu_seqlens_q the new keys must be in the cache already");
  if (c.num_splits < 0 || c.num_splits > 1024) return invalid("num_splits: expected 0 (chosen) to 1024");
  const AttentionForwardParams p = cache_view(given, c);
  if (p.batch == 0) return Status{};  // no sequence: nothing to append or attend
  if (c.seqlen_new > p.seqlen_k)
    return make_status(StatusCode::kInvalidArgument, "k_new: %lld new keys do not fit a cache of %lld keys per sequence",
                       static_cast<long long>(c.seqlen_new), static_cast<long long>(p.seqlen_k));
  if (Status s = check_problem(p); !s.ok()) return s;
  const bool attends = p.seqlen_q > 0 && p.nheads > 0;  // without query rows, only the append runs
  if (p.batch == 0 || (!attends && c.seqlen_new == 0)) return Status{};
  const bool reads_cache = p.seqlen_k > 0 || c.seqlen_new > 0;
  const struct { const char* name; const void* ptr; bool needed; } pointers[] = {
      {"q", p.q, attends}, {"out", p.out, attends}, {"k_cache", p.k, reads_cache}, {"v_cache", p.v, reads_cache}};
  for (const auto& t : pointers)
    if (t.needed && t.ptr == nullptr) return make_status(StatusCode::kInvalidArgument, "%s: must not be null", t.name);
  // An append without query rows chooses no kernel: the head dims it copies are checked here.
  if (c.seqlen_new > 0 && (p.headdim % 8 != 0 || p.headdim > 256 || v_headdim(p) != p.headdim))
    return make_status(StatusCode::kInvalidArgument,
                       "k_new, v_new: expected one head dim, a multiple of 8 up to 256 (got %lld and %lld)",
                       static_cast<long long>(p.headdim), static_cast<long long>(v_headdim(p)));
  if (Status s = check_alibi(p); !s.ok()) return s;
  const Rows qr = q_rows(p);
  const int64_t cache_batch = paged ? c.num_pages : p.batch, cache_rows = paged ? c.page_size : p.seqlen_k;
  const bool append = c.seqlen_new > 0;
  const Operand inputs[] = {
      tensor4("q", p.q, qr.batch, qr.rows, p.nheads, p.headdim, qr.batch_stride(p.q_batch_stride), p.q_row_stride,
              p.q_head_stride, 2),
      tensor4("k_new", c.k_new, p.batch, c.seqlen_new, p.nheads_kv, p.headdim, c.k_new_batch_stride,
              c.k_new_row_stride, c.k_new_head_stride, 2, append),
      tensor4("v_new", c.v_new, p.batch, c.seqlen_new, p.nheads_kv, v_headdim(p), c.v_new_batch_stride,
              c.v_new_row_stride, c.v_new_head_stride, 2, append),
      Operand{"cache_seqlens", c.cache_seqlens, 1, {p.batch, 1, 1, 1}, {1, 1, 1, 1}, 4, true},
      Operand{"page_table", c.page_table, 2, {p.batch, c.max_pages, 1, 1}, {c.page_table_batch_stride, 1, 1, 1}, 4,
              paged},
      alibi_operand(p),
  };
  const Operand caches[] = {
      tensor4("k_cache", p.k, cache_batch, cache_rows, p.nheads_kv, p.headdim, p.k_batch_stride, p.k_row_stride,
              p.k_head_stride, 2),
      tensor4("v_cache", p.v, cache_batch, cache_rows, p.nheads_kv, v_headdim(p), p.v_batch_stride, p.v_row_stride,
              p.v_head_stride, 2),
  };
  const Operand outputs[] = {
      tensor4("out", p.out, qr.batch, qr.rows, p.nheads, v_headdim(p), qr.batch_stride(p.out_batch_stride),
              p.out_row_stride, p.out_head_stride, 2),
      lse_tensor("lse", p.lse, qr.batch, p.nheads, qr.rows, qr.batch_stride(p.lse_batch_stride), p.lse_head_stride),
      bytes_buffer("workspace", p.workspace, p.workspace_bytes),
      caches[0],
      caches[1],
  };
  for (const Operand& o : {inputs[0], inputs[1], inputs[2], caches[0], caches[1], outputs[0]})
    if (Status s = check_aligned16(o); !s.ok()) return s;
  if (p.workspace != nullptr && reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0)
    return invalid("workspace: expected a 16-byte aligned device buffer");
  // The caches are written only by an append; otherwise they are inputs the outputs must avoid.
  if (append) return check_no_overlap(outputs, inputs);
  const Operand written[] = {outputs[0], outputs[1], outputs[2]};
  const Operand read[] = {inputs[0], inputs[3], inputs[4], inputs[5], caches[0], caches[1]};
  return check_no_overlap(written, read);
}

// Everything a KV-cache call launches: its forward's params (packing and splits applied), its
// launcher, and the workspace's layout: the splits' parts, or the pages' contiguous copy.
struct KvCacheRun {
  FwdKernelParams kernel{};
  FwdLauncher launch = nullptr;
  SplitKvLayout split;
  KvGatherLayout gather;  // bytes 0: the kernel reads the cache where it is
  size_t workspace_bytes() const { return split.bytes + gather.bytes; }
};

Status plan_kvcache(const AttentionForwardParams& p, const KVCacheParams& c, Backend backend, KvCacheRun* run) {
  int capability = 0;
  if (Status s = device_capability(p.device, &capability); !s.ok()) return s;
  KernelQuery query = query_of(p);
  query.kv_cache = true;
  query.paged_kv = c.page_table != nullptr;
  // Splits asked for (num_splits > 1) are the Ampere path's split-KV: such calls are chosen as decoding.
  query.kv_seqlen_q = c.num_splits > 1 ? 0 : p.seqlen_q;
  query.page_size = c.page_size;
  query.kv_group = p.nheads_kv > 0 ? p.nheads / p.nheads_kv : 1;
  const KvGatherLayout gather =
      kv_gather_layout(p.batch, p.seqlen_k, p.nheads_kv, p.headdim, v_headdim(p), 2);
  query.kv_copy_bytes = c.page_table != nullptr && c.copy_pages ? static_cast<int64_t>(gather.bytes) : 0;
  KernelChoice choice;
  if (Status s = choose_kernel(query, backend, capability, &choice); !s.ok()) return s;
  run->launch = find_fwd_launcher(choice.backend, p.dtype, choice.headdim, choice.headdim_v);
  if (run->launch == nullptr)
    return make_status(StatusCode::kNotSupported, "no launcher for the chosen kernel (head dim %d)", choice.headdim);

  FwdKernelParams k = kernel_params(p);
  k.seqused_k_add = static_cast<int>(c.seqlen_new);
  if (c.page_table != nullptr) {
    k.page_table = c.page_table;
    k.page_table_batch_stride = c.page_table_batch_stride;
    k.page_divisor = PageDivisor::of(static_cast<int>(c.page_size));
    k.num_pages = static_cast<int>(c.num_pages);
  }
  // The Hopper path (prefill-sized calls): one pass over the keys, no split and no workspace.
  if (choice.backend == Backend::kHopper) {
    // No tile claims either: the workspace, where there is one, holds the page copy, and a
    // claims counter at its start would overwrite the copy's first keys.
    k.workspace = nullptr, k.workspace_bytes = 0, k.tile_claims = nullptr;
    k.num_splits = 1;
    run->kernel = k;  // run->split stays empty
    if (choice.copies_pages) run->gather = gather;
    return Status{};
  }
  FwdTileQuery tile_query = find_ampere_fwd_tile(p.dtype, choice.headdim);
  if (tile_query == nullptr)
    return make_status(StatusCode::kNotSupported, "no launcher for the chosen kernel (head dim %d)", choice.headdim);
  DeviceGuard guard(p.device);
  if (!guard.status().ok()) return guard.status();
  FwdTileInfo tiles_of;
  if (Status s = tile_query(&tiles_of); !s.ok()) return s;
  int device = 0, sms = 0;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return cuda_status(err, "cudaGetDevice");
  if (cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); err != cudaSuccess)
    return cuda_status(err, "cudaDeviceGetAttribute");
  k = kvcache_packed_view(k, kvcache_packed_heads(k, tiles_of.wide.block_m));
  auto splits_on = [&](const FwdTile& tile) {
    const long long tiles = static_cast<long long>((k.seqlen_q + tile.block_m - 1) / tile.block_m) * k.nheads * k.batch;
    const int key_blocks = (k.seqlen_k + tile.block_n - 1) / tile.block_n;
    const int ctas_per_sm = c.page_table != nullptr ? tile.ctas_per_sm_paged : tile.ctas_per_sm;
    return kvcache_splits(tiles, key_blocks, sms * ctas_per_sm, static_cast<int>(c.num_splits), k.batch);
  };
  // Split on the wide tile's plan; a split call the narrow tile runs (run_fwd's rule) is planned
  // on the narrow tile, and runs on the wide one if that plan does not split.
  int splits = splits_on(tiles_of.wide);
  if (runs_narrow_tile(k.seqlen_q, splits, tiles_of.narrow.block_m)) splits = splits_on(tiles_of.narrow);
  const int64_t rows = p.cu_seqlens_q != nullptr ? p.total_q : p.batch * p.seqlen_q;
  run->split = split_kv_layout(rows, p.nheads, v_headdim(p), splits);
  k.num_splits = splits;
  k.partial_rows = rows;
  k.partial_heads = static_cast<int>(p.nheads);
  run->kernel = k;
  return Status{};
}

}  // namespace

Status attention_with_kvcache_plan(const AttentionForwardParams& given, const KVCacheParams& cache,
                                   int64_t* num_splits, size_t* workspace_bytes, Backend backend) {
  if (num_splits == nullptr || workspace_bytes == nullptr) return invalid("num_splits, workspace_bytes must not be null");
  *num_splits = 1, *workspace_bytes = 0;
  KVCacheParams c = cache;
  if (c.cache_seqlens == nullptr) c.cache_seqlens = reinterpret_cast<const int32_t*>(16);  // not read
  AttentionForwardParams shape = given;
  shape.q = shape.k = shape.v = shape.out = nullptr, shape.lse = nullptr, shape.workspace = nullptr;
  const AttentionForwardParams p = cache_view(shape, c);
  if (p.batch == 0) return Status{};
  if (Status s = check_problem(p); !s.ok()) return s;
  if (p.batch == 0 || p.seqlen_q == 0 || p.nheads == 0) return Status{};
  KvCacheRun run;
  if (Status s = plan_kvcache(p, c, backend, &run); !s.ok()) return s;
  *num_splits = run.kernel.num_splits;
  *workspace_bytes = run.workspace_bytes();
  return Status{};
}

Status attention_with_kvcache(const AttentionForwardParams& given, const KVCacheParams& cache, Backend backend) {
  if (Status s = check_kvcache(given, cache); !s.ok()) return s;
  const AttentionForwardParams p = cache_view(given, cache);
  const bool attends = p.seqlen_q > 0 && p.nheads > 0;
  if (p.batch == 0 || (!attends && cache.seqlen_new == 0)) return Status{};
  KvCacheRun run;
  if (attends) {
    if (Status s = plan_kvcache(p, cache, backend, &run); !s.ok()) return s;
    const char* use = run.gather.bytes > 0 ? "a contiguous copy of the pages" : "the splits' parts";
    if (run.workspace_bytes() > 0 && p.workspace == nullptr)
      return make_status(StatusCode::kInvalidArgument,
                         "workspace: null, but the call needs attention_with_kvcache_plan()'s %zu bytes (%s)",
                         run.workspace_bytes(), use);
    if (p.workspace_bytes < run.workspace_bytes())
      return make_status(StatusCode::kInvalidArgument,
                         "workspace: %zu bytes given, attention_with_kvcache_plan() asks for %zu (%s)",
                         p.workspace_bytes, run.workspace_bytes(), use);
  }
  DeviceGuard guard(p.device);
  if (!guard.status().ok()) return guard.status();
  if (cache.seqlen_new > 0) {
    KvAppendParams a{};
    a.k_new = cache.k_new, a.v_new = cache.v_new, a.k_cache = const_cast<void*>(p.k), a.v_cache = const_cast<void*>(p.v);
    a.k_new_batch_stride = cache.k_new_batch_stride, a.k_new_row_stride = cache.k_new_row_stride;
    a.k_new_head_stride = cache.k_new_head_stride;
    a.v_new_batch_stride = cache.v_new_batch_stride, a.v_new_row_stride = cache.v_new_row_stride;
    a.v_new_head_stride = cache.v_new_head_stride;
    a.k_batch_stride = p.k_batch_stride, a.k_row_stride = p.k_row_stride, a.k_head_stride = p.k_head_stride;
    a.v_batch_stride = p.v_batch_stride, a.v_row_stride = p.v_row_stride, a.v_head_stride = p.v_head_stride;
    a.cache_seqlens = cache.cache_seqlens;
    a.page_table = cache.page_table;
    a.page_table_batch_stride = cache.page_table_batch_stride;
    a.page_size = static_cast<int>(cache.page_size), a.num_pages = static_cast<int>(cache.num_pages);
    a.capacity = static_cast<int>(p.seqlen_k);
    a.batch = static_cast<int>(p.batch), a.seqlen_new = static_cast<int>(cache.seqlen_new);
    a.heads_kv = static_cast<int>(p.nheads_kv), a.headdim = static_cast<int>(p.headdim);
    a.headdim_v = static_cast<int>(v_headdim(p));
    a.elem_bytes = 2;
    if (Status s = launch_kv_append(a, p.stream); !s.ok()) return s;
  }
  if (!attends) return Status{};
  FwdKernelParams k = run.kernel;
  if (run.gather.bytes > 0) {  // the used rows, copied; the kernel reads them as a batched cache
    char* base = static_cast<char*>(p.workspace);
    KvGatherParams g{};
    g.k_cache = p.k, g.v_cache = p.v;
    g.k_out = base, g.v_out = base + run.gather.v_offset;
    g.k_page_stride = p.k_batch_stride, g.k_row_stride = p.k_row_stride, g.k_head_stride = p.k_head_stride;
    g.v_page_stride = p.v_batch_stride, g.v_row_stride = p.v_row_stride, g.v_head_stride = p.v_head_stride;
    g.cache_seqlens = cache.cache_seqlens, g.seqlen_new = static_cast<int>(cache.seqlen_new);
    g.page_table = cache.page_table, g.page_table_batch_stride = cache.page_table_batch_stride;
    g.page_size = k.page_divisor, g.num_pages = k.num_pages;
    g.capacity = static_cast<int>(p.seqlen_k);
    g.batch = static_cast<int>(p.batch), g.heads_kv = static_cast<int>(p.nheads_kv);
    g.headdim = static_cast<int>(p.headdim), g.headdim_v = static_cast<int>(v_headdim(p));
    g.elem_bytes = 2;
    if (Status s = launch_kv_gather(g, p.stream); !s.ok()) return s;
    k.k = g.k_out, k.v = g.v_out;
    k.k_head_stride = p.headdim, k.k_row_stride = p.nheads_kv * p.headdim, k.k_batch_stride = p.seqlen_k * k.k_row_stride;
    k.v_head_stride = v_headdim(p), k.v_row_stride = p.nheads_kv * v_headdim(p);
    k.v_batch_stride = p.seqlen_k * k.v_row_stride;
    k.page_table = nullptr, k.page_table_batch_stride = 0, k.page_divisor = PageDivisor{}, k.num_pages = 0;
    k.after_kv_copy = true;
  }
  if (k.num_splits > 1) {
    char* base = static_cast<char*>(p.workspace);
    k.partial_o = reinterpret_cast<float*>(base + run.split.o_offset);
    k.partial_lse = reinterpret_cast<float*>(base + run.split.lse_offset);
    // Packed queries: rows outside every sequence (offsets that break the rules) get no part;
    // NaN LSEs (all bits set) make the merge skip them instead of reading stale workspace.
    if (p.cu_seqlens_q != nullptr)
      if (cudaError_t err = cudaMemsetAsync(k.partial_lse, 0xff, size_t(run.split.lse_index(k.num_splits, 0, 0)) * sizeof(float),
                                            p.stream);
          err != cudaSuccess)
        return cuda_status(err, "cudaMemsetAsync");
  }
  if (Status s = run.launch(k, p.stream); !s.ok()) return s;
  if (k.num_splits <= 1) return Status{};
  // The splits' parts, merged into out and lse (merge_states.h); packed q is one batch of total_q rows.
  const SplitKvLayout& l = run.split;
  MergeStatesParams m{};
  const bool packed_q = p.cu_seqlens_q != nullptr;
  m.sources = 1;
  m.states = k.num_splits;
  m.o_state_stride = l.o_index(1, 0, 0);
  m.lse_state_stride = l.lse_index(1, 0, 0);
  m.source[0] = StateView{k.partial_o, k.partial_lse, packed_q ? 0 : p.seqlen_q * l.headdim_v, l.headdim_v,
                          l.rows * l.headdim_v, packed_q ? 0 : p.seqlen_q, l.rows, 1};
  m.out = StateView{p.out, p.lse, packed_q ? 0 : p.out_batch_stride, p.out_row_stride, p.out_head_stride,
                    packed_q ? 0 : p.lse_batch_stride, p.lse_head_stride, 1};
  m.batch = packed_q ? 1 : static_cast<int>(p.batch);
  m.seqlen = static_cast<int>(packed_q ? p.total_q : p.seqlen_q);
  m.heads = static_cast<int>(p.nheads);
  m.headdim = static_cast<int>(v_headdim(p));
  return launch_merge_states(m, MergeElement::kFloat32,
                             p.dtype == DType::kBFloat16 ? MergeElement::kBFloat16 : MergeElement::kFloat16,
                             /*after_producer=*/true, p.stream);
}

Status merge_attention_states(const MergeAttentionStatesParams& p) {
  if (p.batch < 0 || p.seqlen < 0 || p.nheads < 0 || p.headdim < 0)
    return invalid("batch, seqlen, nheads, headdim: expected sizes >= 0");
  if (p.headdim > 256) return make_status(StatusCode::kNotSupported, "headdim: at most 256, got %lld", (long long)p.headdim);
  if (p.batch > std::numeric_limits<int32_t>::max() || p.seqlen > std::numeric_limits<int32_t>::max() ||
      p.nheads > std::numeric_limits<int32_t>::max())
    return invalid("batch, seqlen, nheads: expected 32-bit sizes");
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat32)
    return invalid("dtype: expected float16, bfloat16 or float32");
  if (p.batch == 0 || p.seqlen == 0 || p.nheads == 0 || p.headdim == 0) return Status{};
  const struct { const char* name; const void* ptr; } pointers[] = {
      {"out_a", p.out_a}, {"lse_a", p.lse_a}, {"out_b", p.out_b}, {"lse_b", p.lse_b}, {"out", p.out}};
  for (const auto& t : pointers)
    if (t.ptr == nullptr) return make_status(StatusCode::kInvalidArgument, "%s: must not be null", t.name);
  const int eb = p.dtype == DType::kFloat32 ? 4 : 2;
  const Operand inputs[] = {
      tensor4("out_a", p.out_a, p.batch, p.seqlen, p.nheads, p.headdim, p.out_a_batch_stride, p.out_a_row_stride,
              p.out_a_head_stride, eb),
      tensor4("out_b", p.out_b, p.batch, p.seqlen, p.nheads, p.headdim, p.out_b_batch_stride, p.out_b_row_stride,
              p.out_b_head_stride, eb),
      Operand{"lse_a", p.lse_a, 3, {p.batch, p.nheads, p.seqlen, 1}, {p.lse_a_batch_stride, p.lse_a_head_stride, p.lse_a_row_stride, 1}, 4, true},
      Operand{"lse_b", p.lse_b, 3, {p.batch, p.nheads, p.seqlen, 1}, {p.lse_b_batch_stride, p.lse_b_head_stride, p.lse_b_row_stride, 1}, 4, true},
  };
  const Operand outputs[] = {
      tensor4("out", p.out, p.batch, p.seqlen, p.nheads, p.headdim, p.out_batch_stride, p.out_row_stride,
              p.out_head_stride, eb),
      Operand{"lse", p.lse, 3, {p.batch, p.nheads, p.seqlen, 1}, {p.lse_batch_stride, p.lse_head_stride, p.lse_row_stride, 1}, 4,
              p.lse != nullptr},
  };
  for (const Operand& o : inputs)
    for (int i = 0; i < o.ndim; ++i)
      if (o.stride[i] < 0) return make_status(StatusCode::kInvalidArgument, "%s: expected non-negative strides", o.name);
  if (Status s = check_no_overlap(outputs, inputs); !s.ok()) return s;
  MergeStatesParams m{};
  m.sources = 2, m.states = 2;
  m.source[0] = StateView{const_cast<void*>(p.out_a), const_cast<float*>(p.lse_a), p.out_a_batch_stride,
                          p.out_a_row_stride, p.out_a_head_stride, p.lse_a_batch_stride, p.lse_a_head_stride,
                          p.lse_a_row_stride};
  m.source[1] = StateView{const_cast<void*>(p.out_b), const_cast<float*>(p.lse_b), p.out_b_batch_stride,
                          p.out_b_row_stride, p.out_b_head_stride, p.lse_b_batch_stride, p.lse_b_head_stride,
                          p.lse_b_row_stride};
  m.out = StateView{p.out, p.lse, p.out_batch_stride, p.out_row_stride, p.out_head_stride, p.lse_batch_stride,
                    p.lse_head_stride, p.lse_row_stride};
  m.batch = static_cast<int>(p.batch), m.seqlen = static_cast<int>(p.seqlen), m.heads = static_cast<int>(p.nheads);
  m.headdim = static_cast<int>(p.headdim);
  const MergeElement e = p.dtype == DType::kFloat32    ? MergeElement::kFloat32
                         : p.dtype == DType::kBFloat16 ? MergeElement::kBFloat16
                                                       : MergeElement::kFloat16;
  DeviceGuard guard(p.device);
  if (!guard.status().ok()) return guard.status();
  return launch_merge_states(m, e, e, /*after_producer=*/false, p.stream);
}

BuildInfo build_info() {
  return BuildInfo{FLASHCUTE_VERSION,          FLASHCUTE_CUDA_ARCHS,       FLASHCUTE_AMPERE_HEAD_DIMS,
                   FLASHCUTE_AMPERE_DTYPES,    FLASHCUTE_HOPPER_HEAD_DIMS, FLASHCUTE_HOPPER_DTYPES,
                   CUDART_VERSION,             FLASHCUTE_HOPPER_BWD_HEAD_DIMS,
                   FLASHCUTE_HOPPER_DV_PAIRS, FLASHCUTE_HOPPER_FP8_HEAD_DIMS,
                   FLASHCUTE_AMPERE_SM80_ONLY};
}

}  // namespace flashcute
