// flashcute public C++ API: exact softmax attention (FlashAttention-style fused kernels).
//
// Every entry point validates its arguments and returns a Status; none aborts, throws or
// allocates device memory. Launches go on the stream the caller puts in the params.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#if defined(_WIN32)
#define FLASHCUTE_API
#else
#define FLASHCUTE_API __attribute__((visibility("default")))
#endif

namespace flashcute {

enum class DType : int32_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,     // merge_attention_states only
  kFloat8E4M3 = 3,  // e4m3fn (FP8) q, k and v of attention_forward, on the Hopper path
};

// Which kernel family runs the call. kAuto picks by the device's compute capability.
enum class Backend : int32_t { kAuto = 0, kAmpere = 1, kHopper = 2 };

enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,  // shapes, strides, pointers or scalars the kernels cannot take
  kNotSupported = 2,     // valid request, but no kernel for it was compiled or exists
  kNoDevice = 3,         // no CUDA driver or no GPU
  kCudaError = 4,        // a CUDA runtime call or a launch failed
};

struct Status {
  StatusCode code = StatusCode::kOk;
  char message[512] = {0};
  bool ok() const { return code == StatusCode::kOk; }
};

// Forward attention over tensors of layout (batch, seqlen, heads, headdim). Strides are in
// elements; the headdim stride is 1. K and V have nheads_kv heads, nheads % nheads_kv == 0.
struct AttentionForwardParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;   // same dtype as q (FP8: out_dtype below)
  float* lse = nullptr;  // optional: (batch, nheads, seqlen_q) float32, natural log
  // Optional device workspace, 16-byte aligned, of attention_forward_workspace_size() bytes
  // (often 0). With it the Hopper path may run its last wave of query tiles split over all
  // SMs, and a variable-length or windowed call's CTAs claim their tiles; without it (or with fewer bytes)
  // the call runs unsplit, in a fixed tile order, with the same results. It needs no
  // initialization and may be reused once the call's work has finished.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t nheads = 0;
  int64_t nheads_kv = 0;
  // A multiple of 8: the call runs the smallest compiled kernel of at least this head dim,
  // which reads and writes only these columns (build_info() lists the compiled head dims).
  int64_t headdim = 0;
  // V's and out's head dim, a multiple of 8; 0 (default): headdim. A value other than headdim
  // runs on the Hopper path only: the forward on a head dim pair kernel at least as large in
  // both (build_info().hopper_dv_pairs), the backward on a backward kernel at least as large
  // as both head dims; elsewhere kNotSupported.
  int64_t headdim_v = 0;

  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;  // lse row stride is 1

  float softmax_scale = 0.f;  // applied to q·kᵀ before the softmax
  bool causal = false;        // bottom-right aligned when seqlen_q != seqlen_k
  // Local (sliding-window) attention: query i sees key j only where
  // i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right;
  // -1 leaves a side unbounded. causal sets window_right to 0.
  int64_t window_left = -1, window_right = -1;
  // > 0: each scaled score s becomes softcap · tanh(s / softcap) before the mask and softmax.
  float softcap = 0.f;
  // ALiBi (optional, device memory on `device`): after softcap and before the mask, the score
  // of query row i and key j in batch b and query head h gains
  // -alibi_slopes[b * alibi_slopes_batch_stride + h] · |i + seqlen_k - seqlen_q - j|, with the
  // lengths of sequence b in a variable-length batch (seqlen_k: its seqused_k where given).
  // float32, nheads slopes per row, 4-byte aligned; a batch stride of 0 gives every batch the
  // same row. null: no ALiBi.
  const float* alibi_slopes = nullptr;
  int64_t alibi_slopes_batch_stride = 0;
  // Dropout on the attention weights, after the softmax: weight (b, h, i, j) — i and j within
  // sequence b — is kept with probability 1 - dropout_p (p rounded to a multiple of 2^-16) and
  // kept weights are scaled by 1 / (1 - dropout_p); 0 turns it off. The keep mask is a function
  // of (dropout_seed, dropout_offset, b, h, i, j) (Philox4x32-10, see dropout.h), so the backward
  // regenerates it from the same two values. dropout_rng_state (optional, device int64[2] on
  // `device`, 8-byte aligned): the kernels read {seed, offset} from there instead, which lets a
  // captured CUDA graph take fresh values on every replay.
  float dropout_p = 0.f;
  uint64_t dropout_seed = 0, dropout_offset = 0;
  const int64_t* dropout_rng_state = nullptr;
  // Variable-length batches (all optional, device int32). With cu_seqlens_q (batch + 1
  // offsets), q and out are packed (total_q, nheads, headdim): sequence b's queries are rows
  // [cu_seqlens_q[b], cu_seqlens_q[b + 1]), seqlen_q is the longest sequence's length
  // (max_seqlen_q), q_batch_stride and out_batch_stride are ignored, and lse is
  // (nheads, total_q) with lse_head_stride (lse_batch_stride ignored). cu_seqlens_k does the
  // same for k and v. seqused_k (batch): sequence b uses only its first seqused_k[b] keys, and
  // causal and window align to that length. The values are not read on the host; whatever they
  // are, the kernels clamp them so that no access leaves [0, total) rows or goes past
  // max_seqlen rows of a sequence.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_k = nullptr;
  int64_t total_q = 0, total_k = 0;  // rows of the packed tensors (with cu_seqlens)
  DType dtype = DType::kFloat16;
  int device = -1;            // CUDA device of the pointers; -1: the current device
  cudaStream_t stream = nullptr;
  // FP8 (dtype kFloat8E4M3; otherwise these must stay null): float32 descales, device memory on
  // `device`, 4-byte aligned; an element's value is its e4m3 value times its descale; null: 1.
  // Per head: q_descale[b · q_descale_batch_stride + h · q_descale_head_stride] for query head h
  // (q_descale_per_kv_head: for K/V head h / (nheads / nheads_kv), FlashAttention-3's
  // convention), k_descale and v_descale likewise for K/V head h. Per block: a non-zero block
  // stride adds (row / kFp8DescaleBlock) · block_stride for query or key row `row` (in its
  // sequence). Variable-length batches take per-head descales, b the sequence. The values are
  // not read on the host.
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int64_t q_descale_batch_stride = 0, q_descale_head_stride = 0, q_descale_block_stride = 0;
  int64_t k_descale_batch_stride = 0, k_descale_head_stride = 0, k_descale_block_stride = 0;
  int64_t v_descale_batch_stride = 0, v_descale_head_stride = 0, v_descale_block_stride = 0;
  bool q_descale_per_kv_head = false;
  DType out_dtype = DType::kBFloat16;  // FP8 calls: out's dtype, kBFloat16 or kFloat16
};

// Rows per block of FP8 block descales (queries and keys alike, every head dim).
constexpr int64_t kFp8DescaleBlock = 128;

// Bytes of the optional forward workspace for these sizes, dtype, mask, ALiBi and backend on
// params.device (pointers are not read; a non-null alibi_slopes only says that ALiBi is on):
// fp32 partial results where the Hopper path splits the last wave of a call without causal or
// window mask over all SMs (up to 2 · SMs · tile rows · (kernel head dim + 8) · 4 bytes); 16
// bytes for a variable-length call on the Hopper path, or one with a window's left side over more
// than two waves of query tiles (the counter through which its CTAs claim their tiles; FP8
// calls: 0); else 0.
FLASHCUTE_API Status attention_forward_workspace_size(const AttentionForwardParams& params, size_t* bytes,
                                                      Backend backend = Backend::kAuto);

// Runs the forward pass. Rows with no key to attend to produce zeros and lse = -inf.
FLASHCUTE_API Status attention_forward(const AttentionForwardParams& params, Backend backend = Backend::kAuto);

// Backward attention: gradients of the forward's inputs from dout = dL/dout, recomputing the
// attention weights from q, k and the forward's lse (no N×N matrix is stored). Same layouts and
// rules as AttentionForwardParams; dk and dv have nheads_kv heads (summed over each GQA group).
// The caller provides a device workspace of attention_backward_workspace_size() bytes, 16-byte
// aligned; it needs no initialization and may be reused once the call's work has finished.
struct AttentionBackwardParams {
  const void* dout = nullptr;  // (batch, seqlen_q, nheads, headdim_v), like out
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;    // the forward's output
  const float* lse = nullptr;   // the forward's lse: (batch, nheads, seqlen_q) float32
  void* dq = nullptr;           // like q
  void* dk = nullptr;           // like k
  void* dv = nullptr;           // like v (headdim_v columns)
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t nheads = 0;
  int64_t nheads_kv = 0;
  int64_t headdim = 0;  // as in AttentionForwardParams (the backward's own compiled head dims)
  int64_t headdim_v = 0;  // v's, out's, dout's and dv's; 0: headdim (as in AttentionForwardParams)

  int64_t dout_batch_stride = 0, dout_row_stride = 0, dout_head_stride = 0;
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;  // lse row stride is 1

  float softmax_scale = 0.f;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;  // as in AttentionForwardParams
  float softcap = 0.f;                          // as in AttentionForwardParams
  const float* alibi_slopes = nullptr;          // as in AttentionForwardParams
  int64_t alibi_slopes_batch_stride = 0;
  // Dropout, as in AttentionForwardParams: the forward's p, seed and offset (or rng state).
  float dropout_p = 0.f;
  uint64_t dropout_seed = 0, dropout_offset = 0;
  const int64_t* dropout_rng_state = nullptr;
  // Variable-length batches, as in AttentionForwardParams; dq/dout/out follow q's layout and
  // dk/dv follow k's. Keys past seqused_k[b] get zero dk and dv.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_k = nullptr;
  int64_t total_q = 0, total_k = 0;
  // Bitwise reproducible gradients: the Ampere path then computes dQ in its own pass over
  // query blocks instead of adding every key block's part with floating-point atomics. The
  // Hopper path always adds dQ with atomics, so with kAuto this flag picks the Ampere path
  // and an explicit kHopper is refused.
  bool deterministic = false;
  DType dtype = DType::kFloat16;
  int device = -1;
  cudaStream_t stream = nullptr;
};

// Bytes of workspace attention_backward needs for these sizes, dtype, `causal`,
// `deterministic` and backend (pointers are not read): fp32 row sums, and an fp32 dQ
// accumulator (in chunks of heads for long sequences) except for a deterministic call; the
// Hopper path also keeps the lse in log2 units and, without causal masking, fp32 dK/dV sums
// for the last wave's key blocks that run split over several CTAs. kAuto sizes for the path the device would run, or for the larger one
// when no device can be queried.
FLASHCUTE_API Status attention_backward_workspace_size(const AttentionBackwardParams& params,
                                                       size_t* bytes,
                                                       Backend backend = Backend::kAuto);

// Runs the backward pass: writes dq, dk and dv.
FLASHCUTE_API Status attention_backward(const AttentionBackwardParams& params,
                                        Backend backend = Backend::kAuto);

// A KV cache for attention_with_kvcache. The forward params' k and v are the caches:
//  - batched: (batch, seqlen_cache, nheads_kv, headdim) with seqlen_k = seqlen_cache;
//  - paged (page_table not null): (num_pages, page_size, nheads_kv, headdim), k_batch_stride and
//    v_batch_stride stepping one page; key row r of sequence b is row r % page_size of page
//    page_table[b * page_table_batch_stride + r / page_size], and seqlen_k is ignored (the
//    capacity is max_pages * page_size). Any page size >= 1.
// Sequence b attends to its first cache_seqlens[b] + seqlen_new keys (causal and window align
// to that length). With k_new/v_new (batch, seqlen_new, nheads_kv, headdim), the call first
// writes them into the cache at rows cache_seqlens[b] .. + seqlen_new - 1 (not with
// cu_seqlens_q); cache_seqlens is not advanced. Values in cache_seqlens and page_table are not
// read on the host: the kernels clamp them, so that none makes an access leave the tensors (an
// append to a row outside the capacity or to a page id outside [0, num_pages) is skipped).
struct KVCacheParams {
  const int32_t* cache_seqlens = nullptr;  // (batch), device int32: keys before the append
  const int32_t* page_table = nullptr;     // (batch, max_pages), device int32; null: batched
  int64_t page_table_batch_stride = 0;
  int64_t max_pages = 0, page_size = 0, num_pages = 0;
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int64_t seqlen_new = 0;
  int64_t k_new_batch_stride = 0, k_new_row_stride = 0, k_new_head_stride = 0;
  int64_t v_new_batch_stride = 0, v_new_row_stride = 0, v_new_head_stride = 0;
  // Key blocks of each query tile split over this many CTAs (split-KV), merged through the
  // workspace; 0: chosen from the device's wave efficiency (attention_with_kvcache_plan).
  int64_t num_splits = 0;
  // A prefill against a paged cache may copy the cache's used rows into the workspace and read
  // them from there (KernelChoice::copies_pages); false keeps it on the pages.
  bool copy_pages = true;
};

// The splits a KV-cache call runs with and the workspace it needs (fp32 partial outputs, 0 bytes
// for one split; or a paged cache's contiguous copy), for the params' sizes, mask and head dims
// on params.device. No pointer is read, but a paged call's plan needs cache.page_table non-null
// (any value), its page_size and max_pages, and cache.copy_pages: paged calls may run on another
// kernel or path (paged_kernels.h) or copy the pages. The same params give the same plan, so a
// CUDA graph may capture the call.
FLASHCUTE_API Status attention_with_kvcache_plan(const AttentionForwardParams& params, const KVCacheParams& cache,
                                                 int64_t* num_splits, size_t* workspace_bytes,
                                                 Backend backend = Backend::kAuto);

// Attention against a KV cache (decoding, chunked prefill): appends k_new/v_new, then runs the
// forward over the cache with the params' q, out, lse, scale, causal, window, softcap and ALiBi
// (q may be packed with cu_seqlens_q; cu_seqlens_k, seqused_k and dropout are refused). kAuto
// runs prefill-sized calls on the Hopper path on sm90 where its TMA loads read the pages or the
// pages are copied into the workspace first (KernelChoice::copies_pages), everything else on the
// Ampere-path kernels (choose_kernel); kHopper copies pages those loads cannot read, and is
// refused, naming page_table, where cache.copy_pages is false or the copy would pass its bound.
// params.workspace: attention_with_kvcache_plan's bytes. No allocation and no host
// synchronization: capturable.
FLASHCUTE_API Status attention_with_kvcache(const AttentionForwardParams& params, const KVCacheParams& cache,
                                            Backend backend = Backend::kAuto);

// Two attention outputs of the same query rows over disjoint key sets, merged:
// lse = log(exp(lse_a) + exp(lse_b)), out = exp(lse_a - lse)·out_a + exp(lse_b - lse)·out_b.
// out_* (batch, seqlen, nheads, headdim), unit headdim stride, one dtype (float16, bfloat16 or
// float32); lse_* float32 (batch, nheads, seqlen). Rows empty in both (lse -inf) give zeros and
// -inf; a state with lse = -inf is not read.
struct MergeAttentionStatesParams {
  const void* out_a = nullptr;
  const void* out_b = nullptr;
  const float* lse_a = nullptr;
  const float* lse_b = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // may be null
  int64_t batch = 0, seqlen = 0, nheads = 0, headdim = 0;
  int64_t out_a_batch_stride = 0, out_a_row_stride = 0, out_a_head_stride = 0;
  int64_t out_b_batch_stride = 0, out_b_row_stride = 0, out_b_head_stride = 0;
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;
  int64_t lse_a_batch_stride = 0, lse_a_head_stride = 0, lse_a_row_stride = 0;
  int64_t lse_b_batch_stride = 0, lse_b_head_stride = 0, lse_b_row_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;
  DType dtype = DType::kFloat16;
  int device = -1;
  cudaStream_t stream = nullptr;
};
FLASHCUTE_API Status merge_attention_states(const MergeAttentionStatesParams& params);

// What dispatch reads of a call: its head dims, dtype and, for a backward, `deterministic`.
struct KernelQuery {
  int64_t headdim = 0;    // q's and k's; 0: any (asks about the path alone)
  int64_t headdim_v = 0;  // v's; 0: headdim
  DType dtype = DType::kFloat16;
  bool any_dtype = false;  // true: dtype is not asked about
  bool backward = false;
  bool deterministic = false;  // backward only
  bool kv_cache = false;       // attention_with_kvcache (forward)
  bool paged_kv = false;       // with a page table
  // KV-cache calls: query rows per sequence (max_seqlen_q where packed) and the page size (0:
  // contiguous cache). Prefill-sized calls run on the Hopper path where its TMA loads fit the
  // pages; decoding runs the Ampere path's split-KV kernels (see choose_kernel).
  int64_t kv_seqlen_q = 0;
  int64_t page_size = 0;
  // Paged prefill: query heads per K/V head, and the bytes of a contiguous copy of the cache's
  // capacity (0: no workspace for one). See KernelChoice::copies_pages.
  int64_t kv_group = 1;
  int64_t kv_copy_bytes = 0;
};

// The compiled kernel that runs a call.
struct KernelChoice {
  Backend backend = Backend::kAuto;  // kAmpere or kHopper
  int headdim = 0;                   // the kernel's head dim: the call's, rounded up
  int headdim_v = 0;                 // the kernel's V head dim
  // KV-cache calls: the paged cache's used rows are first copied into a contiguous workspace,
  // which the kernel reads instead of the pages (kv_gather.h).
  bool copies_pages = false;
};

// Which path and kernel run a call when `backend` is requested on a GPU of compute capability
// `capability` (major * 10 + minor): the one decision attention_forward, attention_backward and
// the workspace queries take on such a GPU, for front ends to ask rather than repeat. Reads no
// device. kNotSupported says why nothing runs the call, naming the argument (backend, v, head
// dim or dtype); kNoDevice: a GPU older than sm80 with kAuto.
FLASHCUTE_API Status choose_kernel(const KernelQuery& query, Backend backend, int capability, KernelChoice* choice);

// Compute capability of `device` as major * 10 + minor, in *capability.
FLASHCUTE_API Status device_capability(int device, int* capability);

// Waits for all work on `stream` of `device` (-1: the current device).
FLASHCUTE_API Status synchronize_stream(int device, cudaStream_t stream);

// Which backend kAuto resolves to on a device of the given capability (kAmpere or kHopper).
FLASHCUTE_API Backend default_backend(int capability);

// What this build of the library contains.
struct BuildInfo {
  const char* version;
  const char* cuda_archs;         // e.g. "80;90;90a"
  const char* ampere_head_dims;   // e.g. "32;64;96;128;192;256", empty when not built
  const char* ampere_dtypes;      // e.g. "float16;bfloat16"
  const char* hopper_head_dims;
  const char* hopper_dtypes;
  int cuda_runtime_version;       // CUDART_VERSION the library was built against
  const char* hopper_backward_head_dims;  // Hopper-path backward; other head dims use the Ampere one
  const char* hopper_dv_pairs;  // Hopper-path (head dim, V head dim) pairs, e.g. "192,128", ';'-separated
  const char* hopper_fp8_head_dims;  // Hopper-path FP8 (e4m3) forward head dims, e.g. "64;128;256"
  const char* ampere_sm80_only;  // Ampere-path head dims without sm90 code, e.g. "32;96;192"; an
                                // sm90 GPU runs them on a larger kernel
};
FLASHCUTE_API BuildInfo build_info();

// FP8 (e4m3fn) quantization of x (batch, seqlen, nheads, headdim), unit headdim stride, float16,
// bfloat16 or float32, headdim a multiple of 8 up to 256, for FP8 attention inputs:
// out = x / descale rounded to nearest even and saturated at ±448, true value = out · descale.
// descale = amax / 448 of each group, 1 for a group of zeros: per head (batch, nheads), the
// amax over seqlen × headdim, or with `block` (batch, nheads, ceil(seqlen / 128)), the amax over
// each block of 128 rows × headdim. With `hadamard` (head dims 64, 128 and 256), x's rows are
// first rotated: y = (x · signs) H / sqrt(headdim), H the Sylvester Hadamard matrix and the
// signs ±1 keyed by `seed` (the same seed for Q and K keeps Q Kᵀ); amax and out are then y's.
// NaNs of x do not enter amax and stay NaN in out.
struct QuantizeFp8Params {
  const void* x = nullptr;  // 16-byte aligned rows (strides multiples of 16 bytes)
  DType dtype = DType::kFloat16;
  void* out = nullptr;        // contiguous (batch, seqlen, nheads, headdim) e4m3fn bytes, 16-byte aligned
  float* descale = nullptr;   // contiguous float32, of the shape above
  int64_t batch = 0, seqlen = 0, nheads = 0, headdim = 0;
  int64_t x_batch_stride = 0, x_row_stride = 0, x_head_stride = 0;  // in elements
  bool block = false;
  bool hadamard = false;
  uint64_t seed = 0;
  // Per-head scales only: quantize_fp8_workspace_size() bytes of device memory, 4-byte aligned;
  // the call zeroes it on the stream (cross-CTA maxima and arrival counts) and may reuse it once
  // the call's work has finished.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int device = -1;
  cudaStream_t stream = nullptr;
};

// Bytes of workspace quantize_fp8 needs: 8 per (batch, head) with per-head scales, else 0.
FLASHCUTE_API size_t quantize_fp8_workspace_size(int64_t batch, int64_t nheads, bool block);

// Quantizes x into out and descale. A call with no rows (batch, seqlen or nheads 0) launches
// nothing and writes nothing (per-head scales of empty heads would be 1).
FLASHCUTE_API Status quantize_fp8(const QuantizeFp8Params& params);

}  // namespace flashcute
