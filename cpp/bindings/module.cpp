// Python extension flashcute._C: DLPack tensors in, the public C++ API underneath.
// Validation with argument names lives in python/flashcute; this layer only translates
// tensors into params and a Status into a Python exception.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "dispatch_policy.h"
#include "philox.h"
#include "flashcute/flashcute.h"
#include "fwd_tail_split.h"
#include "hopper/fwd_config.h"
#include "hopper/fwd_packed_heads.h"
#ifdef FLASHCUTE_XLA_FFI
#include "xla_ffi.h"
#endif

namespace nb = nanobind;

namespace {

using Tensor = nb::ndarray<nb::ro>;
using MutableTensor = nb::ndarray<>;

std::string dtype_name(nb::dlpack::dtype dt) {
  const auto code = static_cast<nb::dlpack::dtype_code>(dt.code);
  std::string base;
  switch (code) {
    case nb::dlpack::dtype_code::Int: base = "int"; break;
    case nb::dlpack::dtype_code::UInt: base = "uint"; break;
    case nb::dlpack::dtype_code::Float: base = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: base = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: base = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    case nb::dlpack::dtype_code::Float8_E4M3FN: return "float8_e4m3fn";
    case nb::dlpack::dtype_code::Float8_E5M2: return "float8_e5m2";
    default: base = "unknown"; break;
  }
  std::string name = base + std::to_string(dt.bits);
  if (dt.lanes != 1) name += "x" + std::to_string(dt.lanes);
  return name;
}

// (device_type, device_id, dtype, shape, strides in elements) of any DLPack tensor.
std::tuple<int, int, std::string, std::vector<int64_t>, std::vector<int64_t>> inspect(Tensor t) {
  std::vector<int64_t> shape(t.ndim()), strides(t.ndim());
  for (size_t i = 0; i < t.ndim(); ++i) {
    shape[i] = t.shape(i);
    strides[i] = t.stride(i);
  }
  return {t.device_type(), t.device_id(), dtype_name(t.dtype()), shape, strides};
}

void raise_on_error(const flashcute::Status& status) {
  switch (status.code) {
    case flashcute::StatusCode::kOk: return;
    case flashcute::StatusCode::kInvalidArgument:
    case flashcute::StatusCode::kNotSupported: throw nb::value_error(status.message);
    default: throw std::runtime_error(status.message);
  }
}

// q's dtype. FP8 comes as DLPack's float8_e4m3fn, or as uint8 bytes with uint8_as_fp8 (frameworks
// that cannot export float8 types through DLPack).
flashcute::DType to_dtype(nb::dlpack::dtype dt, bool uint8_as_fp8 = false) {
  using code = nb::dlpack::dtype_code;
  if (dt.code == static_cast<uint8_t>(code::Bfloat) && dt.bits == 16 && dt.lanes == 1)
    return flashcute::DType::kBFloat16;
  if (dt.code == static_cast<uint8_t>(code::Float) && dt.bits == 16 && dt.lanes == 1)
    return flashcute::DType::kFloat16;
  if (dt.bits == 8 && dt.lanes == 1 &&
      (dt.code == static_cast<uint8_t>(code::Float8_E4M3FN) || (uint8_as_fp8 && dt.code == static_cast<uint8_t>(code::UInt))))
    return flashcute::DType::kFloat8E4M3;
  if (dt.code == static_cast<uint8_t>(code::Float8_E5M2))
    throw nb::type_error("q: float8_e5m2 is unsupported (FP8 attention takes float8_e4m3fn)");
  throw nb::type_error(("q: expected float16, bfloat16 or float8_e4m3fn, got " + dtype_name(dt)).c_str());
}

// ALiBi's slopes into params (batch and nheads already set): (nheads,) or (batch, nheads)
// float32 on q's device with unit stride over heads. The Python layer checks the same with the
// same names; this repeats them for callers of the extension.
template <class Params>
void set_alibi_slopes(Params& p, const std::optional<Tensor>& slopes, const Tensor& q) {
  if (!slopes) return;
  const Tensor& s = *slopes;
  if (s.dtype() != nb::dtype<float>())
    throw nb::type_error(("alibi_slopes: expected float32, got " + dtype_name(s.dtype())).c_str());
  const size_t ndim = s.ndim();
  const bool per_batch = ndim == 2;
  if ((ndim != 1 && !per_batch) || static_cast<int64_t>(s.shape(ndim - 1)) != p.nheads ||
      (per_batch && static_cast<int64_t>(s.shape(0)) != p.batch))
    throw nb::value_error("alibi_slopes: expected shape (nheads,) or (batch, nheads)");
  if (s.shape(ndim - 1) > 1 && s.stride(ndim - 1) != 1)
    throw nb::value_error("alibi_slopes: expected unit stride over heads");
  if (s.device_type() != q.device_type() || s.device_id() != q.device_id())
    throw nb::value_error("alibi_slopes: expected a tensor on q's device");
  p.alibi_slopes = static_cast<const float*>(s.data());
  p.alibi_slopes_batch_stride = per_batch && s.shape(0) > 1 ? s.stride(0) : 0;
}

// Dropout into params: p, the seed and offset, or the device pair {seed, offset} (int64 (2,)
// on q's device) that the kernels read instead.
template <class Params>
void set_dropout(Params& p, float dropout_p, uint64_t seed, uint64_t offset, const std::optional<Tensor>& rng_state,
                 const Tensor& q) {
  p.dropout_p = dropout_p;
  p.dropout_seed = seed;
  p.dropout_offset = offset;
  if (!rng_state) return;
  const Tensor& s = *rng_state;
  if (s.dtype() != nb::dtype<int64_t>())
    throw nb::type_error(("dropout_rng_state: expected int64, got " + dtype_name(s.dtype())).c_str());
  if (s.ndim() != 1 || s.shape(0) != 2 || s.stride(0) != 1)
    throw nb::value_error("dropout_rng_state: expected a contiguous tensor of shape (2,): {seed, offset}");
  if (s.device_type() != q.device_type() || s.device_id() != q.device_id())
    throw nb::value_error("dropout_rng_state: expected a tensor on q's device");
  p.dropout_rng_state = static_cast<const int64_t*>(s.data());
}

// One q-like or k-like tensor as the params take it: batched (batch, seqlen, heads, headdim),
// or packed (total, heads, headdim) with cu_seqlens (batch 1, batch stride 0).
struct Rows {
  int64_t batch, rows, heads, headdim;
  int64_t batch_stride, row_stride, head_stride;
  bool same_rows(const Rows& o) const { return batch == o.batch && rows == o.rows && heads == o.heads; }
  bool same_shape(const Rows& o) const { return same_rows(o) && headdim == o.headdim; }
};

template <class T>
Rows rows_of(const T& t, bool packed, const std::string& name) {
  if (packed) {
    if (t.ndim() != 3)
      throw nb::value_error((name + ": expected a 3-d packed tensor (total, heads, headdim) with cu_seqlens").c_str());
    if (t.stride(2) != 1) throw nb::value_error((name + ": expected unit stride in the headdim dimension").c_str());
    return {1, static_cast<int64_t>(t.shape(0)), static_cast<int64_t>(t.shape(1)), static_cast<int64_t>(t.shape(2)),
            0, t.stride(0), t.stride(1)};
  }
  if (t.ndim() != 4)
    throw nb::value_error((name + ": expected a 4-d tensor (batch, seqlen, heads, headdim)").c_str());
  if (t.stride(3) != 1) throw nb::value_error((name + ": expected unit stride in the headdim dimension").c_str());
  return {static_cast<int64_t>(t.shape(0)), static_cast<int64_t>(t.shape(1)), static_cast<int64_t>(t.shape(2)),
          static_cast<int64_t>(t.shape(3)), t.stride(0), t.stride(1), t.stride(2)};
}

// The variable-length arguments of a call (seq_view.h): int32 device vectors on q's device,
// and the sizes they imply. Their values are the kernels' to clamp; only shapes are checked.
struct Varlen {
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_k = nullptr;
  int64_t batch = -1;  // from the offsets' lengths; -1: none given

  Varlen(const std::optional<Tensor>& cu_q, const std::optional<Tensor>& cu_k, const std::optional<Tensor>& used,
         const Tensor& q) {
    cu_seqlens_q = vector(cu_q, "cu_seqlens_q", q, true);
    cu_seqlens_k = vector(cu_k, "cu_seqlens_k", q, true);
    seqused_k = vector(used, "seqused_k", q, false);
    if (used && batch >= 0 && static_cast<int64_t>(used->shape(0)) != batch)
      throw nb::value_error("seqused_k: expected one entry per sequence (batch)");
  }
  bool packed_q() const { return cu_seqlens_q != nullptr; }
  bool packed_k() const { return cu_seqlens_k != nullptr; }
  // The batch of the call: the offsets' (they agree) or a batched tensor's, which must match.
  int64_t resolve_batch(const Rows& q, const Rows& k, const std::optional<Tensor>& used) const {
    int64_t b = batch >= 0 ? batch : !packed_q() ? q.batch : k.batch;
    if ((!packed_q() && q.batch != b) || (!packed_k() && k.batch != b))
      throw nb::value_error("cu_seqlens_q, cu_seqlens_k: batch size does not match the batched tensors'");
    if (used && static_cast<int64_t>(used->shape(0)) != b)
      throw nb::value_error("seqused_k: expected one entry per sequence (batch)");
    return b;
  }

 private:
  const int32_t* vector(const std::optional<Tensor>& t, const char* name, const Tensor& q, bool offsets) {
    if (!t) return nullptr;
    const std::string n = name;
    if (t->ndim() != 1 || t->dtype() != nb::dtype<int32_t>() || (t->shape(0) > 1 && t->stride(0) != 1))
      throw nb::value_error((n + ": expected a contiguous 1-d int32 tensor").c_str());
    if (t->device_type() != q.device_type() || t->device_id() != q.device_id())
      throw nb::value_error((n + ": expected a tensor on q's device").c_str());
    if (offsets) {
      if (t->shape(0) < 2) throw nb::value_error((n + ": expected batch + 1 >= 2 offsets").c_str());
      const int64_t b = static_cast<int64_t>(t->shape(0)) - 1;
      if (batch >= 0 && b != batch)
        throw nb::value_error("cu_seqlens_q, cu_seqlens_k: expected the same number of offsets");
      batch = b;
    }
    return static_cast<const int32_t*>(t->data());
  }
};

template <class Params>
void set_varlen(Params& p, const Varlen& vl, const Rows& q, const Rows& k, int64_t max_seqlen_q,
                int64_t max_seqlen_k) {
  p.cu_seqlens_q = vl.cu_seqlens_q, p.cu_seqlens_k = vl.cu_seqlens_k, p.seqused_k = vl.seqused_k;
  if (vl.packed_q()) p.total_q = q.rows, p.seqlen_q = max_seqlen_q;
  if (vl.packed_k()) p.total_k = k.rows, p.seqlen_k = max_seqlen_k;
}

// A forward's scalars, dtype, device and stream from q and the call's arguments.
void set_call(flashcute::AttentionForwardParams& p, const Tensor& q, float softmax_scale, bool causal,
              int64_t window_left, int64_t window_right, float softcap, uintptr_t stream, bool uint8_as_fp8 = false) {
  p.softmax_scale = softmax_scale;
  p.causal = causal;
  p.window_left = window_left, p.window_right = window_right;
  p.softcap = softcap;
  p.dtype = to_dtype(q.dtype(), uint8_as_fp8);
  p.device = q.device_id();
  p.stream = reinterpret_cast<cudaStream_t>(stream);
}

// lse: (batch, heads, seqlen_q), or (heads, total_q) for packed queries; unit row stride.
template <class T>
void lse_strides(const T& lse, bool packed, const Rows& q, int64_t* batch_stride, int64_t* head_stride) {
  const bool ok = lse.dtype() == nb::dtype<float>() &&
                  (packed ? lse.ndim() == 2 && static_cast<int64_t>(lse.shape(0)) == q.heads &&
                                static_cast<int64_t>(lse.shape(1)) == q.rows && (q.rows <= 1 || lse.stride(1) == 1)
                          : lse.ndim() == 3 && lse.stride(2) == 1);
  if (!ok)
    throw nb::value_error(packed ? "lse: expected a float32 (heads, total_q) tensor with unit last stride"
                                 : "lse: expected a float32 (batch, heads, seqlen_q) tensor");
  *batch_stride = packed ? 0 : lse.stride(0);
  *head_stride = packed ? lse.stride(0) : lse.stride(1);
}

// FP8 descales (float32 on q's device): (batch, heads) per head, or (batch, heads, blocks of
// 128 rows) per block; q's heads are nheads or nheads_kv. The Python layer checks the same with
// the same names.
void set_descale(const flashcute::AttentionForwardParams& p, const std::optional<Tensor>& d, const char* name,
                 const Tensor& q, int64_t heads, int64_t alt_heads, int64_t rows, bool varlen, const float** ptr,
                 int64_t* batch_stride, int64_t* head_stride, int64_t* block_stride, bool* alt) {
  if (!d) return;
  const std::string n = name;
  if (d->dtype() != nb::dtype<float>()) throw nb::type_error((n + ": expected float32, got " + dtype_name(d->dtype())).c_str());
  if (d->device_type() != q.device_type() || d->device_id() != q.device_id())
    throw nb::value_error((n + ": expected a tensor on q's device").c_str());
  const int64_t blocks = (rows + flashcute::kFp8DescaleBlock - 1) / flashcute::kFp8DescaleBlock;
  const size_t ndim = d->ndim();
  const int64_t h = ndim >= 2 ? static_cast<int64_t>(d->shape(1)) : -1;
  const bool ok = (ndim == 2 || (ndim == 3 && !varlen && static_cast<int64_t>(d->shape(2)) == blocks)) &&
                  static_cast<int64_t>(d->shape(0)) == p.batch && (h == heads || h == alt_heads);
  if (!ok) throw nb::value_error((n + ": expected shape (batch, heads) or (batch, heads, ceil(seqlen / 128)) "
                                      "(per head only in variable-length batches)").c_str());
  *ptr = static_cast<const float*>(d->data());
  *batch_stride = d->shape(0) > 1 ? d->stride(0) : 0;
  *head_stride = d->shape(1) > 1 ? d->stride(1) : 0;
  *block_stride = ndim == 3 && d->shape(2) > 1 ? d->stride(2) : 0;
  if (alt != nullptr) *alt = h != heads;
}

// Tensors are (batch, seqlen, heads, headdim); lse is (batch, heads, seqlen). With cu_seqlens_q
// (cu_seqlens_k), q and out (k and v) are packed (total, heads, headdim) and lse (heads, total_q).
void forward(Tensor q, Tensor k, Tensor v, MutableTensor out, std::optional<MutableTensor> lse,
             float softmax_scale, bool causal, int backend, uintptr_t stream,
             std::optional<MutableTensor> workspace, int64_t window_left, int64_t window_right, float softcap,
             std::optional<Tensor> alibi_slopes, std::optional<Tensor> cu_seqlens_q,
             std::optional<Tensor> cu_seqlens_k, std::optional<Tensor> seqused_k, int64_t max_seqlen_q,
             int64_t max_seqlen_k, float dropout_p, uint64_t dropout_seed, uint64_t dropout_offset,
             std::optional<Tensor> dropout_rng_state, std::optional<Tensor> q_descale,
             std::optional<Tensor> k_descale, std::optional<Tensor> v_descale, bool uint8_as_fp8) {
  const Varlen vl(cu_seqlens_q, cu_seqlens_k, seqused_k, q);
  const Rows qr = rows_of(q, vl.packed_q(), "q"), kr = rows_of(k, vl.packed_k(), "k");
  const Rows vr = rows_of(v, vl.packed_k(), "v"), outr = rows_of(out, vl.packed_q(), "out");
  // v and out may have a head dim of their own (the kernel lookup decides whether it runs).
  if (!vr.same_rows(kr) || !outr.same_rows(qr) || outr.headdim != vr.headdim || kr.headdim != qr.headdim)
    throw nb::value_error("q, k, v, out: shapes do not match");
  flashcute::AttentionForwardParams p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.out = out.data();
  p.batch = vl.resolve_batch(qr, kr, seqused_k);
  p.seqlen_q = qr.rows;
  p.nheads = qr.heads;
  p.headdim = qr.headdim;
  p.headdim_v = vr.headdim;
  p.seqlen_k = kr.rows;
  p.nheads_kv = kr.heads;
  set_varlen(p, vl, qr, kr, max_seqlen_q, max_seqlen_k);
  p.q_batch_stride = qr.batch_stride, p.q_row_stride = qr.row_stride, p.q_head_stride = qr.head_stride;
  p.k_batch_stride = kr.batch_stride, p.k_row_stride = kr.row_stride, p.k_head_stride = kr.head_stride;
  p.v_batch_stride = vr.batch_stride, p.v_row_stride = vr.row_stride, p.v_head_stride = vr.head_stride;
  p.out_batch_stride = outr.batch_stride, p.out_row_stride = outr.row_stride, p.out_head_stride = outr.head_stride;
  if (lse) {
    if (!vl.packed_q() && (lse->ndim() != 3 || lse->dtype() != nb::dtype<float>() || lse->stride(2) != 1))
      throw nb::value_error("lse: expected a float32 (batch, heads, seqlen_q) tensor");
    lse_strides(*lse, vl.packed_q(), qr, &p.lse_batch_stride, &p.lse_head_stride);
    p.lse = static_cast<float*>(lse->data());
  }
  if (workspace) {
    p.workspace = workspace->data();
    p.workspace_bytes = workspace->nbytes();
  }
  set_call(p, q, softmax_scale, causal, window_left, window_right, softcap, stream, uint8_as_fp8);
  const bool fp8 = p.dtype == flashcute::DType::kFloat8E4M3;
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype())
    throw nb::type_error("q, k, v: expected one dtype for all three");
  const bool out_16bit = out.dtype().bits == 16 && out.dtype().lanes == 1 &&
                         (out.dtype().code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) ||
                          out.dtype().code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float));
  if (fp8 ? !out_16bit : out.dtype() != q.dtype())
    throw nb::type_error(fp8 ? "out: expected bfloat16 or float16 for float8_e4m3fn inputs" : "out: expected q's dtype");
  if (fp8) p.out_dtype = to_dtype(out.dtype());
  set_alibi_slopes(p, alibi_slopes, q);
  set_dropout(p, dropout_p, dropout_seed, dropout_offset, dropout_rng_state, q);
  if (!fp8 && (q_descale || k_descale || v_descale))
    throw nb::type_error("q_descale, k_descale, v_descale: only float8_e4m3fn inputs take descales");
  const bool packed = vl.packed_q() || vl.packed_k() || seqused_k.has_value();
  set_descale(p, q_descale, "q_descale", q, p.nheads, p.nheads_kv, p.seqlen_q, packed, &p.q_descale,
              &p.q_descale_batch_stride, &p.q_descale_head_stride, &p.q_descale_block_stride,
              &p.q_descale_per_kv_head);
  set_descale(p, k_descale, "k_descale", q, p.nheads_kv, p.nheads_kv, p.seqlen_k, packed, &p.k_descale,
              &p.k_descale_batch_stride, &p.k_descale_head_stride, &p.k_descale_block_stride, nullptr);
  set_descale(p, v_descale, "v_descale", q, p.nheads_kv, p.nheads_kv, p.seqlen_k, packed, &p.v_descale,
              &p.v_descale_batch_stride, &p.v_descale_head_stride, &p.v_descale_block_stride, nullptr);

  flashcute::Status status;
  {
    nb::gil_scoped_release release;
    status = flashcute::attention_forward(p, static_cast<flashcute::Backend>(backend));
  }
  raise_on_error(status);
}

void backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, MutableTensor dq,
              MutableTensor dk, MutableTensor dv, MutableTensor workspace, float softmax_scale,
              bool causal, bool deterministic, int backend, uintptr_t stream, int64_t window_left,
              int64_t window_right, float softcap, std::optional<Tensor> alibi_slopes,
              std::optional<Tensor> cu_seqlens_q, std::optional<Tensor> cu_seqlens_k,
              std::optional<Tensor> seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k, float dropout_p,
              uint64_t dropout_seed, uint64_t dropout_offset, std::optional<Tensor> dropout_rng_state) {
  const Varlen vl(cu_seqlens_q, cu_seqlens_k, seqused_k, q);
  const bool pq = vl.packed_q(), pk = vl.packed_k();
  const Rows qr = rows_of(q, pq, "q"), kr = rows_of(k, pk, "k"), vr = rows_of(v, pk, "v");
  const Rows doutr = rows_of(dout, pq, "dout"), outr = rows_of(out, pq, "out"), dqr = rows_of(dq, pq, "dq");
  const Rows dkr = rows_of(dk, pk, "dk"), dvr = rows_of(dv, pk, "dv");
  if (!doutr.same_rows(qr) || !outr.same_rows(qr) || !dqr.same_shape(qr) || !vr.same_rows(kr) ||
      !dkr.same_shape(kr) || !dvr.same_shape(vr) || kr.headdim != qr.headdim || doutr.headdim != vr.headdim ||
      outr.headdim != vr.headdim)
    throw nb::value_error("dout, q, k, v, out, dq, dk, dv: shapes do not match");
  const auto dt = q.dtype();
  if (dout.dtype() != dt || k.dtype() != dt || v.dtype() != dt || out.dtype() != dt ||
      dq.dtype() != dt || dk.dtype() != dt || dv.dtype() != dt)
    throw nb::type_error("dout, q, k, v, out, dq, dk, dv: expected one dtype for all");
  flashcute::AttentionBackwardParams p;
  p.batch = vl.resolve_batch(qr, kr, seqused_k);
  if (!pq && (lse.ndim() != 3 || static_cast<int64_t>(lse.shape(0)) != p.batch ||
              static_cast<int64_t>(lse.shape(1)) != qr.heads || static_cast<int64_t>(lse.shape(2)) != qr.rows))
    throw nb::value_error("lse: expected a float32 (batch, heads, seqlen_q) tensor");
  lse_strides(lse, pq, qr, &p.lse_batch_stride, &p.lse_head_stride);
  p.dout = dout.data(), p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = out.data();
  p.lse = static_cast<const float*>(lse.data());
  p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data();
  p.workspace = workspace.data();
  p.workspace_bytes = workspace.nbytes();
  p.seqlen_q = qr.rows, p.nheads = qr.heads, p.headdim = qr.headdim, p.headdim_v = vr.headdim;
  p.seqlen_k = kr.rows, p.nheads_kv = kr.heads;
  set_varlen(p, vl, qr, kr, max_seqlen_q, max_seqlen_k);
  p.dout_batch_stride = doutr.batch_stride, p.dout_row_stride = doutr.row_stride, p.dout_head_stride = doutr.head_stride;
  p.q_batch_stride = qr.batch_stride, p.q_row_stride = qr.row_stride, p.q_head_stride = qr.head_stride;
  p.k_batch_stride = kr.batch_stride, p.k_row_stride = kr.row_stride, p.k_head_stride = kr.head_stride;
  p.v_batch_stride = vr.batch_stride, p.v_row_stride = vr.row_stride, p.v_head_stride = vr.head_stride;
  p.out_batch_stride = outr.batch_stride, p.out_row_stride = outr.row_stride, p.out_head_stride = outr.head_stride;
  p.dq_batch_stride = dqr.batch_stride, p.dq_row_stride = dqr.row_stride, p.dq_head_stride = dqr.head_stride;
  p.dk_batch_stride = dkr.batch_stride, p.dk_row_stride = dkr.row_stride, p.dk_head_stride = dkr.head_stride;
  p.dv_batch_stride = dvr.batch_stride, p.dv_row_stride = dvr.row_stride, p.dv_head_stride = dvr.head_stride;
  p.softmax_scale = softmax_scale;
  p.causal = causal;
  p.window_left = window_left, p.window_right = window_right;
  p.softcap = softcap;
  p.deterministic = deterministic;
  set_alibi_slopes(p, alibi_slopes, q);
  set_dropout(p, dropout_p, dropout_seed, dropout_offset, dropout_rng_state, q);
  p.dtype = to_dtype(q.dtype());
  p.device = q.device_id();
  p.stream = reinterpret_cast<cudaStream_t>(stream);
  flashcute::Status status;
  {
    nb::gil_scoped_release release;
    status = flashcute::attention_backward(p, static_cast<flashcute::Backend>(backend));
  }
  raise_on_error(status);
}

// Params of a workspace-size query: sizes, dtype and mask (pointers are not read).
template <class Params>
Params size_query(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t nheads, int64_t nheads_kv,
                  int64_t headdim, const std::string& dtype, bool causal, int64_t window_left,
                  int64_t window_right) {
  Params p;
  p.batch = batch, p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k;
  p.nheads = nheads, p.nheads_kv = nheads_kv, p.headdim = headdim;
  if (dtype != "float16" && dtype != "bfloat16")
    throw nb::value_error("dtype: expected 'float16' or 'bfloat16'");
  p.dtype = dtype == "bfloat16" ? flashcute::DType::kBFloat16 : flashcute::DType::kFloat16;
  p.causal = causal;
  p.window_left = window_left, p.window_right = window_right;
  p.softmax_scale = 1.f;
  return p;
}

// A non-null pointer that says "ALiBi on" to the size queries, which read no pointers.
const float kAlibiFlag = 0.f;

// A 1-d or 2-d int32 device tensor on q's device (cache_seqlens, page_table), checked for shape.
const int32_t* int32_tensor(const Tensor& t, const char* name, const Tensor& q, size_t ndim) {
  const std::string n = name;
  if (t.dtype() != nb::dtype<int32_t>()) throw nb::type_error((n + ": expected int32, got " + dtype_name(t.dtype())).c_str());
  if (t.ndim() != ndim || (t.shape(ndim - 1) > 1 && t.stride(ndim - 1) != 1))
    throw nb::value_error((n + ": expected a " + std::to_string(ndim) + "-d int32 tensor with unit last stride").c_str());
  if (t.device_type() != q.device_type() || t.device_id() != q.device_id())
    throw nb::value_error((n + ": expected a tensor on q's device").c_str());
  return static_cast<const int32_t*>(t.data());
}

// The forward and cache params of a KV-cache call (kvcache_forward and kvcache_plan share them).
struct KvCacheCall {
  flashcute::AttentionForwardParams p;
  flashcute::KVCacheParams c;
};

void set_cache(KvCacheCall& call, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
               const std::optional<Tensor>& page_table, int64_t batch) {
  const Rows kr = rows_of(k_cache, false, "k_cache"), vr = rows_of(v_cache, false, "v_cache");
  if (!kr.same_rows(vr)) throw nb::value_error("k_cache, v_cache: shapes do not match");
  auto& p = call.p;
  auto& c = call.c;
  p.k = k_cache.data(), p.v = v_cache.data();
  p.nheads_kv = kr.heads;
  p.headdim_v = vr.headdim;
  p.k_batch_stride = kr.batch_stride, p.k_row_stride = kr.row_stride, p.k_head_stride = kr.head_stride;
  p.v_batch_stride = vr.batch_stride, p.v_row_stride = vr.row_stride, p.v_head_stride = vr.head_stride;
  if (page_table) {
    c.page_table = int32_tensor(*page_table, "page_table", q, 2);
    if (static_cast<int64_t>(page_table->shape(0)) != batch)
      throw nb::value_error("page_table: expected one row per sequence (batch, max_pages)");
    c.page_table_batch_stride = page_table->stride(0);
    c.max_pages = page_table->shape(1);
    c.page_size = kr.rows;
    c.num_pages = kr.batch;
  } else {
    if (kr.batch != batch) throw nb::value_error("k_cache: expected one cache per sequence (batch, seqlen_cache, heads, d)");
    p.seqlen_k = kr.rows;
  }
}

void kvcache_forward(Tensor q, Tensor k_cache, Tensor v_cache, MutableTensor out, std::optional<MutableTensor> lse,
                     Tensor cache_seqlens, std::optional<Tensor> page_table, std::optional<Tensor> k_new,
                     std::optional<Tensor> v_new, std::optional<Tensor> cu_seqlens_q, int64_t max_seqlen_q,
                     float softmax_scale, bool causal, int64_t window_left, int64_t window_right, float softcap,
                     std::optional<Tensor> alibi_slopes, int64_t num_splits, std::optional<MutableTensor> workspace,
                     int backend, uintptr_t stream, bool copy_pages) {
  const Varlen vl(cu_seqlens_q, std::nullopt, std::nullopt, q);
  const Rows qr = rows_of(q, vl.packed_q(), "q"), outr = rows_of(out, vl.packed_q(), "out");
  if (!outr.same_rows(qr)) throw nb::value_error("q, out: shapes do not match");
  if (cache_seqlens.ndim() != 1) throw nb::value_error("cache_seqlens: expected a 1-d int32 tensor (batch,)");
  const int64_t batch = vl.packed_q() ? vl.batch : qr.batch;
  KvCacheCall call;
  auto& p = call.p;
  auto& c = call.c;
  c.cache_seqlens = int32_tensor(cache_seqlens, "cache_seqlens", q, 1);
  if (static_cast<int64_t>(cache_seqlens.shape(0)) != batch)
    throw nb::value_error("cache_seqlens: expected one entry per sequence (batch,)");
  p.q = q.data(), p.out = out.data();
  p.batch = batch;
  p.seqlen_q = qr.rows, p.nheads = qr.heads, p.headdim = qr.headdim;
  if (vl.packed_q()) p.cu_seqlens_q = vl.cu_seqlens_q, p.total_q = qr.rows, p.seqlen_q = max_seqlen_q;
  set_cache(call, q, k_cache, v_cache, page_table, batch);
  if (outr.headdim != p.headdim_v) throw nb::value_error("out: expected v_cache's head dim");
  p.q_batch_stride = qr.batch_stride, p.q_row_stride = qr.row_stride, p.q_head_stride = qr.head_stride;
  p.out_batch_stride = outr.batch_stride, p.out_row_stride = outr.row_stride, p.out_head_stride = outr.head_stride;
  if (lse) {
    lse_strides(*lse, vl.packed_q(), qr, &p.lse_batch_stride, &p.lse_head_stride);
    p.lse = static_cast<float*>(lse->data());
  }
  if (k_new.has_value() != v_new.has_value()) throw nb::value_error("k_new, v_new: pass both or neither");
  if (k_new) {
    const Rows knr = rows_of(*k_new, false, "k_new"), vnr = rows_of(*v_new, false, "v_new");
    if (!knr.same_rows(vnr) || knr.batch != batch || knr.heads != p.nheads_kv || knr.headdim != p.headdim ||
        vnr.headdim != p.headdim_v)
      throw nb::value_error("k_new, v_new: expected (batch, seqlen_new, nheads_kv, headdim) like the caches");
    c.k_new = k_new->data(), c.v_new = v_new->data(), c.seqlen_new = knr.rows;
    c.k_new_batch_stride = knr.batch_stride, c.k_new_row_stride = knr.row_stride, c.k_new_head_stride = knr.head_stride;
    c.v_new_batch_stride = vnr.batch_stride, c.v_new_row_stride = vnr.row_stride, c.v_new_head_stride = vnr.head_stride;
    if (k_new->dtype() != q.dtype() || v_new->dtype() != q.dtype())
      throw nb::type_error("k_new, v_new: expected q's dtype");
  }
  c.num_splits = num_splits;
  c.copy_pages = copy_pages;
  if (workspace) p.workspace = workspace->data(), p.workspace_bytes = workspace->nbytes();
  set_call(p, q, softmax_scale, causal, window_left, window_right, softcap, stream);
  if (k_cache.dtype() != q.dtype() || v_cache.dtype() != q.dtype() || out.dtype() != q.dtype())
    throw nb::type_error("q, k_cache, v_cache, out: expected one dtype for all four");
  set_alibi_slopes(p, alibi_slopes, q);
  flashcute::Status status;
  {
    nb::gil_scoped_release release;
    status = flashcute::attention_with_kvcache(p, c, static_cast<flashcute::Backend>(backend));
  }
  raise_on_error(status);
}

std::tuple<int64_t, size_t> kvcache_plan(int64_t batch, int64_t seqlen_q, int64_t nheads, int64_t nheads_kv,
                                         int64_t headdim, int64_t headdim_v, int64_t max_seqlen_k, int64_t num_splits,
                                         int64_t total_q, const std::string& dtype, bool causal, int64_t window_left,
                                         int64_t window_right, bool alibi, int device, int backend, int64_t page_size,
                                         bool copy_pages) {
  static const int32_t kNotRead = 0;
  KvCacheCall call;
  auto& p = call.p;
  p.batch = batch, p.seqlen_q = seqlen_q, p.nheads = nheads, p.nheads_kv = nheads_kv;
  p.headdim = headdim, p.headdim_v = headdim_v, p.seqlen_k = max_seqlen_k;
  if (dtype != "float16" && dtype != "bfloat16") throw nb::value_error("dtype: expected 'float16' or 'bfloat16'");
  p.dtype = dtype == "bfloat16" ? flashcute::DType::kBFloat16 : flashcute::DType::kFloat16;
  p.causal = causal, p.window_left = window_left, p.window_right = window_right;
  p.softmax_scale = 1.f;
  if (alibi) p.alibi_slopes = &kAlibiFlag;
  if (total_q >= 0) p.cu_seqlens_q = &kNotRead, p.total_q = total_q;
  p.device = device;
  call.c.cache_seqlens = &kNotRead;
  call.c.num_splits = num_splits;
  call.c.copy_pages = copy_pages;
  if (page_size > 0) {  // the plan's kernel depends on it (paged_kernels.h); the table is not read
    call.c.page_table = &kNotRead;
    call.c.page_size = page_size, call.c.num_pages = 1;
    call.c.max_pages = std::max<int64_t>((max_seqlen_k + page_size - 1) / page_size, 1);
  }
  int64_t splits = 1;
  size_t bytes = 0;
  raise_on_error(flashcute::attention_with_kvcache_plan(p, call.c, &splits, &bytes, static_cast<flashcute::Backend>(backend)));
  return {splits, bytes};
}

flashcute::DType merge_dtype(nb::dlpack::dtype dt) {
  if (dt == nb::dtype<float>()) return flashcute::DType::kFloat32;
  if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16 && dt.lanes == 1)
    return flashcute::DType::kBFloat16;
  if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && dt.bits == 16 && dt.lanes == 1)
    return flashcute::DType::kFloat16;
  throw nb::type_error(("out_a: expected float16, bfloat16 or float32, got " + dtype_name(dt)).c_str());
}

void merge_states(Tensor out_a, Tensor lse_a, Tensor out_b, Tensor lse_b, MutableTensor out, MutableTensor lse,
                  uintptr_t stream) {
  const Rows a = rows_of(out_a, false, "out_a"), b = rows_of(out_b, false, "out_b"), o = rows_of(out, false, "out");
  if (!a.same_shape(b) || !a.same_shape(o)) throw nb::value_error("out_a, out_b, out: shapes do not match");
  if (out_b.dtype() != out_a.dtype() || out.dtype() != out_a.dtype())
    throw nb::type_error("out_a, out_b, out: expected one dtype");
  auto lse_view = [&](const auto& t, const char* name, int64_t* bs, int64_t* hs, int64_t* rs) {
    if (t.ndim() != 3 || t.dtype() != nb::dtype<float>() || static_cast<int64_t>(t.shape(0)) != a.batch ||
        static_cast<int64_t>(t.shape(1)) != a.heads || static_cast<int64_t>(t.shape(2)) != a.rows)
      throw nb::value_error((std::string(name) + ": expected a float32 (batch, nheads, seqlen) tensor").c_str());
    *bs = t.stride(0), *hs = t.stride(1), *rs = t.stride(2);
    return static_cast<const float*>(t.data());
  };
  for (const Tensor* t : {&out_a, &out_b, &lse_a, &lse_b})
    if (t->device_type() != out.device_type() || t->device_id() != out.device_id())
      throw nb::value_error("out_a, lse_a, out_b, lse_b: expected tensors on out's device");
  flashcute::MergeAttentionStatesParams p;
  p.out_a = out_a.data(), p.out_b = out_b.data(), p.out = out.data();
  p.lse_a = lse_view(lse_a, "lse_a", &p.lse_a_batch_stride, &p.lse_a_head_stride, &p.lse_a_row_stride);
  p.lse_b = lse_view(lse_b, "lse_b", &p.lse_b_batch_stride, &p.lse_b_head_stride, &p.lse_b_row_stride);
  p.lse = const_cast<float*>(lse_view(lse, "lse", &p.lse_batch_stride, &p.lse_head_stride, &p.lse_row_stride));
  p.batch = a.batch, p.seqlen = a.rows, p.nheads = a.heads, p.headdim = a.headdim;
  p.out_a_batch_stride = a.batch_stride, p.out_a_row_stride = a.row_stride, p.out_a_head_stride = a.head_stride;
  p.out_b_batch_stride = b.batch_stride, p.out_b_row_stride = b.row_stride, p.out_b_head_stride = b.head_stride;
  p.out_batch_stride = o.batch_stride, p.out_row_stride = o.row_stride, p.out_head_stride = o.head_stride;
  p.dtype = merge_dtype(out_a.dtype());
  p.device = out.device_id();
  p.stream = reinterpret_cast<cudaStream_t>(stream);
  flashcute::Status status;
  {
    nb::gil_scoped_release release;
    status = flashcute::merge_attention_states(p);
  }
  raise_on_error(status);
}

// A size query's variable-length layout: total_q / total_k >= 0 for a packed side, -1 for a
// batched one; seqlen_q / seqlen_k are then the longest sequences' lengths. The queries read
// no pointer, only whether one is given: a placeholder address stands in for the device data.
template <class Params>
void size_query_varlen(Params& p, int64_t total_q, int64_t total_k, bool seqused_k) {
  static const int32_t kNotRead = 0;
  if (total_q >= 0) p.cu_seqlens_q = &kNotRead, p.total_q = total_q;
  if (total_k >= 0) p.cu_seqlens_k = &kNotRead, p.total_k = total_k;
  if (seqused_k) p.seqused_k = &kNotRead;
}

size_t forward_workspace_size(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t nheads,
                              int64_t nheads_kv, int64_t headdim, const std::string& dtype, bool causal,
                              int backend, int device, int64_t window_left, int64_t window_right, bool alibi,
                              int64_t total_q, int64_t total_k, bool seqused_k, int64_t headdim_v, bool dropout) {
  auto p = size_query<flashcute::AttentionForwardParams>(batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim,
                                                         dtype, causal, window_left, window_right);
  size_query_varlen(p, total_q, total_k, seqused_k);
  p.headdim_v = headdim_v;
  p.device = device;
  if (alibi) p.alibi_slopes = &kAlibiFlag;
  if (dropout) p.dropout_p = 0.5f;  // any p > 0: dropout turns off packed query heads, whose plan differs
  size_t bytes = 0;
  raise_on_error(flashcute::attention_forward_workspace_size(p, &bytes, static_cast<flashcute::Backend>(backend)));
  return bytes;
}

// The forward's last-wave split (fwd_tail_split.h) for `units` tiles of `key_blocks` key blocks
// on `sms` SMs (some tiles partial or not), for tests: (whole_units, tiles, ctas, range starts
// of CTAs 0..ctas, and per split tile its CTAs' slots in CTA order).
std::tuple<int, int, int, std::vector<int>, std::vector<std::vector<int>>> forward_split_plan(
    int units, int key_blocks, int sms, bool partial_tiles, bool few_rows) {
  const flashcute::FwdTailSplit split =
      flashcute::plan_fwd_tail_split(units, key_blocks, sms, partial_tiles, few_rows);
  std::vector<int> begins;
  std::vector<std::vector<int>> slots;
  if (split.tiles > 0) {
    for (int cta = 0; cta <= split.ctas; ++cta) begins.push_back(split.begin(cta));
    for (int tile = 0; tile < split.tiles; ++tile) {
      std::vector<int> tile_slots;
      for (int cta = split.first_cta(tile); cta <= split.last_cta(tile); ++cta)
        tile_slots.push_back(split.slot(cta, tile));
      if (static_cast<int>(tile_slots.size()) != split.parts(tile)) throw std::logic_error("parts mismatch");
      slots.push_back(tile_slots);
    }
  }
  return {split.whole_units, split.tiles, split.ctas, begins, slots};
}

// The Hopper forward's tile for a call, for tests: (keys per block, consumer warpgroups).
std::tuple<int, int> forward_tile(int headdim, int seqlen_q, int seqlen_k, bool causal) {
  namespace hopper = flashcute::hopper;
  const hopper::FwdTileSize tile =
      hopper::fwd_tile_size(headdim, hopper::fwd_second_tile(headdim, seqlen_q, seqlen_k, causal));
  return {tile.block_n, tile.consumers};
}

// Query heads the Hopper forward packs per row block (1: none) for a call.
int forward_packed_heads(int nheads, int nheads_kv, int seqlen_q, int seqlen_k, int headdim, bool causal,
                         bool alibi) {
  namespace hopper = flashcute::hopper;
  flashcute::FwdKernelParams p{};
  p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k, p.nheads = nheads, p.causal = causal, p.headdim = headdim;
  p.headdim_v = headdim;
  if (alibi) p.alibi_slopes = &kAlibiFlag;
  p.window_left = seqlen_k, p.window_right = causal ? 0 : seqlen_q;  // no window
  p.heads_per_kv = nheads_kv > 0 ? nheads / nheads_kv : 1;
  const hopper::FwdTileSize tile =
      hopper::fwd_tile_size(headdim, hopper::fwd_second_tile(headdim, seqlen_q, seqlen_k, causal));
  return hopper::fwd_packed_heads(p, headdim, 64 * tile.consumers);
}

size_t backward_workspace_size(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t nheads,
                               int64_t nheads_kv, int64_t headdim, const std::string& dtype,
                               bool deterministic, int backend, bool causal, int64_t window_left,
                               int64_t window_right, int64_t total_q, int64_t total_k, bool seqused_k) {
  auto p = size_query<flashcute::AttentionBackwardParams>(batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim,
                                                          dtype, causal, window_left, window_right);
  size_query_varlen(p, total_q, total_k, seqused_k);
  p.deterministic = deterministic;
  size_t bytes = 0;
  raise_on_error(flashcute::attention_backward_workspace_size(p, &bytes,
                                                              static_cast<flashcute::Backend>(backend)));
  return bytes;
}

// Keep bits of the dropout group holding weight (row, key) of slice bh, as the kernels draw them
// (api.cpp: set_mask_and_hook, philox.h).
uint32_t dropout_keep_bits(int row, int key, int bh, uint64_t seed, uint64_t offset, float dropout_p) {
  if (row < 0 || key < 0 || bh < 0) throw nb::value_error("row, key, bh: expected values >= 0");
  if (!(dropout_p >= 0.f && dropout_p < 1.f)) throw nb::value_error("dropout_p: expected a value in [0, 1)");
  const double threshold = std::nearbyint(static_cast<double>(dropout_p) * 65536.0);
  const uint32_t kept = static_cast<uint32_t>(std::min(threshold, 65535.0));
  return flashcute::DropoutKey::of(kept, seed, offset).keep_bits(row, key, bh);
}

// A dispatch query from the front ends' values: dtype "" asks about the path alone.
flashcute::KernelQuery kernel_query(int64_t headdim, int64_t headdim_v, const std::string& dtype, bool backward,
                                    bool deterministic) {
  flashcute::KernelQuery q;
  q.headdim = headdim, q.headdim_v = headdim_v, q.backward = backward, q.deterministic = deterministic;
  q.any_dtype = dtype.empty();
  if (!q.any_dtype && dtype != "float16" && dtype != "bfloat16" && dtype != "float8_e4m3fn")
    throw nb::value_error(
        ("dtype: expected 'float16', 'bfloat16', 'float8_e4m3fn' or '', got '" + dtype + "'").c_str());
  q.dtype = dtype == "bfloat16"        ? flashcute::DType::kBFloat16
            : dtype == "float8_e4m3fn" ? flashcute::DType::kFloat8E4M3
                                       : flashcute::DType::kFloat16;
  return q;
}

// (backend, kernel head dim, kernel V head dim) that run a call: the library's dispatch policy.
std::tuple<int, int, int> choose_kernel(int backend, int capability, int64_t headdim, int64_t headdim_v,
                                        const std::string& dtype, bool backward, bool deterministic) {
  flashcute::KernelChoice choice;
  raise_on_error(flashcute::choose_kernel(kernel_query(headdim, headdim_v, dtype, backward, deterministic),
                                          static_cast<flashcute::Backend>(backend), capability, &choice));
  return {static_cast<int>(choice.backend), choice.headdim, choice.headdim_v};
}

// A stand-in build's catalogue, for tests of the policy: {"ampere": {...}, "hopper": {...}} with
// head_dims, backward_head_dims, dtypes and pairs ([d, dv] lists) per path, and optionally
// "ampere_sm80_only" (head dims without sm90 code).
flashcute::KernelCatalogue catalogue_of(const nb::dict& build) {
  flashcute::KernelCatalogue c;
  if (build.contains("ampere_sm80_only")) c.ampere_sm80_only = nb::cast<std::vector<int>>(build["ampere_sm80_only"]);
  for (auto [name, family] : {std::pair<const char*, flashcute::KernelFamily*>{"ampere", &c.ampere},
                              {"hopper", &c.hopper}}) {
    if (!build.contains(name)) continue;
    const nb::dict f = nb::cast<nb::dict>(build[name]);
    auto ints = [&](const char* key) {
      return f.contains(key) ? nb::cast<std::vector<int>>(f[key]) : std::vector<int>{};
    };
    family->head_dims = ints("head_dims");
    family->backward_head_dims = ints("backward_head_dims");
    if (f.contains("dtypes"))
      for (const std::string& t : nb::cast<std::vector<std::string>>(f["dtypes"]))
        family->dtypes.push_back(t == "bfloat16" ? flashcute::DType::kBFloat16 : flashcute::DType::kFloat16);
    if (f.contains("pairs"))
      for (const auto& pair : nb::cast<std::vector<std::vector<int>>>(f["pairs"]))
        family->pairs.emplace_back(pair.at(0), pair.at(1));
  }
  return c;
}

flashcute::KernelChoice choose_in(const nb::dict& build, int backend, int capability, const flashcute::KernelQuery& query) {
  flashcute::KernelChoice choice;
  raise_on_error(flashcute::choose_kernel_in(catalogue_of(build), query, static_cast<flashcute::Backend>(backend),
                                             capability, &choice));
  return choice;
}

std::tuple<int, int, int> choose_kernel_in(const nb::dict& build, int backend, int capability, int64_t headdim,
                                           int64_t headdim_v, const std::string& dtype, bool backward,
                                           bool deterministic, bool kv_cache, int64_t kv_seqlen_q,
                                           int64_t page_size) {
  flashcute::KernelQuery query = kernel_query(headdim, headdim_v, dtype, backward, deterministic);
  query.kv_cache = kv_cache, query.kv_seqlen_q = kv_seqlen_q;
  query.paged_kv = page_size > 0, query.page_size = page_size;
  const flashcute::KernelChoice choice = choose_in(build, backend, capability, query);
  return {static_cast<int>(choice.backend), choice.headdim, choice.headdim_v};
}

// (backend, kernel head dim, whether the pages are copied) of a bf16 KV-cache call.
std::tuple<int, int, bool> choose_kvcache_in(const nb::dict& build, int backend, int capability, int64_t headdim,
                                             int64_t kv_seqlen_q, int64_t page_size, int64_t kv_group,
                                             int64_t kv_copy_bytes) {
  flashcute::KernelQuery query = kernel_query(headdim, 0, "bfloat16", false, false);
  query.kv_cache = true, query.kv_seqlen_q = kv_seqlen_q;
  query.paged_kv = page_size > 0, query.page_size = page_size;
  query.kv_group = kv_group, query.kv_copy_bytes = kv_copy_bytes;
  const flashcute::KernelChoice choice = choose_in(build, backend, capability, query);
  return {static_cast<int>(choice.backend), choice.headdim, choice.copies_pages};
}

int device_capability(int device) {
  int capability = 0;
  raise_on_error(flashcute::device_capability(device, &capability));
  return capability;
}

// FP8 quantization: x (batch, seqlen, heads, headdim) into out (the same shape, contiguous,
// float8_e4m3fn, or its bytes as uint8 from frameworks whose DLPack export has no float8) and descale
// (float32 (batch, heads) or, with block, (batch, heads, blocks), contiguous).
void quantize_fp8(Tensor x, MutableTensor out, MutableTensor descale, std::optional<MutableTensor> workspace,
                  bool block, bool hadamard, uint64_t seed, uintptr_t stream) {
  if (x.device_type() != nb::device::cuda::value && x.device_type() != nb::device::cuda_managed::value)
    throw nb::value_error("x: expected a CUDA tensor");
  const Rows r = rows_of(x, false, "x");
  if (out.ndim() != 4 || static_cast<int64_t>(out.shape(0)) != r.batch || static_cast<int64_t>(out.shape(1)) != r.rows ||
      static_cast<int64_t>(out.shape(2)) != r.heads || static_cast<int64_t>(out.shape(3)) != r.headdim)
    throw nb::value_error("out: expected x's shape (batch, seqlen, nheads, headdim)");
  const nb::dlpack::dtype od = out.dtype();
  const bool fp8 = od.code == 10 && od.bits == 8 && od.lanes == 1;  // DLPack 1.1's kDLFloat8_e4m3fn
  if (!fp8 && od != nb::dtype<uint8_t>())
    throw nb::type_error(("out: expected float8_e4m3fn or uint8, got " + dtype_name(od)).c_str());
  const int64_t contiguous[4] = {r.rows * r.heads * r.headdim, r.heads * r.headdim, r.headdim, 1};
  for (size_t i = 0; i < 4; ++i)
    if (out.shape(i) > 1 && out.stride(i) != contiguous[i]) throw nb::value_error("out: expected a contiguous tensor");
  const int64_t blocks = (r.rows + 127) / 128;
  const size_t scale_dims = block ? 3 : 2;
  bool scale_ok = descale.ndim() == scale_dims && descale.dtype() == nb::dtype<float>() &&
                  static_cast<int64_t>(descale.shape(0)) == r.batch && static_cast<int64_t>(descale.shape(1)) == r.heads &&
                  (!block || static_cast<int64_t>(descale.shape(2)) == blocks);
  int64_t step = 1;
  for (size_t i = scale_dims; scale_ok && i-- > 0; step *= static_cast<int64_t>(descale.shape(i)))
    scale_ok = descale.shape(i) <= 1 || descale.stride(i) == step;
  if (!scale_ok)
    throw nb::value_error(block ? "descale: expected a contiguous float32 (batch, nheads, ceil(seqlen / 128)) tensor"
                                : "descale: expected a contiguous float32 (batch, nheads) tensor");
  const MutableTensor* others[] = {&out, &descale, workspace ? &*workspace : nullptr};
  for (const MutableTensor* t : others)
    if (t != nullptr && (t->device_type() != x.device_type() || t->device_id() != x.device_id()))
      throw nb::value_error("out, descale, workspace: expected tensors on x's device");
  flashcute::QuantizeFp8Params p;
  p.x = x.data();
  const nb::dlpack::dtype xd = x.dtype();
  if (xd == nb::dtype<float>()) {
    p.dtype = flashcute::DType::kFloat32;
  } else if (xd.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && xd.bits == 16 && xd.lanes == 1) {
    p.dtype = flashcute::DType::kBFloat16;
  } else if (xd.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && xd.bits == 16 && xd.lanes == 1) {
    p.dtype = flashcute::DType::kFloat16;
  } else {
    throw nb::type_error(("x: expected float16, bfloat16 or float32, got " + dtype_name(xd)).c_str());
  }
  p.out = out.data();
  p.descale = static_cast<float*>(descale.data());
  p.batch = r.batch, p.seqlen = r.rows, p.nheads = r.heads, p.headdim = r.headdim;
  p.x_batch_stride = r.batch_stride, p.x_row_stride = r.row_stride, p.x_head_stride = r.head_stride;
  p.block = block, p.hadamard = hadamard, p.seed = seed;
  if (workspace) {
    p.workspace = workspace->data();
    p.workspace_bytes = workspace->nbytes();
  }
  p.device = x.device_id();
  p.stream = reinterpret_cast<cudaStream_t>(stream);
  flashcute::Status status;
  {
    nb::gil_scoped_release release;
    status = flashcute::quantize_fp8(p);
  }
  raise_on_error(status);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flashcute kernels behind DLPack; use the flashcute package, not this module.";
  m.def("inspect", &inspect, nb::arg("tensor"),
        "(device_type, device_id, dtype, shape, strides) of a DLPack tensor; strides in elements.");
  m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("softmax_scale"), nb::arg("causal"), nb::arg("backend"),
        nb::arg("stream"), nb::arg("workspace").none() = nb::none(), nb::arg("window_left") = -1,
        nb::arg("window_right") = -1, nb::arg("softcap") = 0.f, nb::arg("alibi_slopes").none() = nb::none(),
        nb::arg("cu_seqlens_q").none() = nb::none(), nb::arg("cu_seqlens_k").none() = nb::none(),
        nb::arg("seqused_k").none() = nb::none(), nb::arg("max_seqlen_q") = 0, nb::arg("max_seqlen_k") = 0,
        nb::arg("dropout_p") = 0.f, nb::arg("dropout_seed") = 0, nb::arg("dropout_offset") = 0,
        nb::arg("dropout_rng_state").none() = nb::none(), nb::arg("q_descale").none() = nb::none(),
        nb::arg("k_descale").none() = nb::none(), nb::arg("v_descale").none() = nb::none(),
        nb::arg("uint8_as_fp8") = false,
        "Attention forward into out (and lse when given); cu_seqlens_q / cu_seqlens_k make q, out / k, v "
        "packed (total, heads, headdim) and lse (heads, total_q). float8_e4m3fn q, k, v (or uint8 with "
        "uint8_as_fp8) take optional float32 descales and write a bfloat16 out.");
  m.def("kvcache_forward", &kvcache_forward, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("cache_seqlens"), nb::arg("page_table").none(), nb::arg("k_new").none(),
        nb::arg("v_new").none(), nb::arg("cu_seqlens_q").none(), nb::arg("max_seqlen_q"), nb::arg("softmax_scale"),
        nb::arg("causal"), nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap"),
        nb::arg("alibi_slopes").none(), nb::arg("num_splits"), nb::arg("workspace").none(), nb::arg("backend"),
        nb::arg("stream"), nb::arg("copy_pages") = true,
        "Attention against a KV cache (contiguous, or paged with page_table), after appending k_new/v_new at "
        "cache_seqlens; num_splits, workspace and copy_pages as given to kvcache_plan.");
  m.def("kvcache_plan", &kvcache_plan, nb::arg("batch"), nb::arg("seqlen_q"), nb::arg("nheads"), nb::arg("nheads_kv"),
        nb::arg("headdim"), nb::arg("headdim_v"), nb::arg("max_seqlen_k"), nb::arg("num_splits"), nb::arg("total_q"),
        nb::arg("dtype"), nb::arg("causal"), nb::arg("window_left"), nb::arg("window_right"), nb::arg("alibi"),
        nb::arg("device"), nb::arg("backend"), nb::arg("page_size") = 0, nb::arg("copy_pages") = true,
        "(num_splits, workspace bytes) of a KV-cache call; max_seqlen_k: the cache's capacity in keys; "
        "total_q >= 0 with cu_seqlens_q, else -1; num_splits 0 asks for the heuristic; page_size: a paged "
        "cache's (0: contiguous); copy_pages: a prefill may copy the pages into the workspace.");
  m.def("merge_states", &merge_states, nb::arg("out_a"), nb::arg("lse_a"), nb::arg("out_b"), nb::arg("lse_b"),
        nb::arg("out"), nb::arg("lse"), nb::arg("stream"),
        "Merges two attention states (out, lse) of the same rows over disjoint keys into out and lse.");
  m.def("quantize_fp8", &quantize_fp8, nb::arg("x"), nb::arg("out"), nb::arg("descale"), nb::arg("workspace").none(),
        nb::arg("block"), nb::arg("hadamard"), nb::arg("seed"), nb::arg("stream"),
        "FP8 (e4m3fn) quantization of x into out and descale, per head or per block of 128 rows, optionally "
        "after a random-sign Hadamard transform; workspace: quantize_fp8_workspace_size bytes (per-head scales).");
  m.def("quantize_fp8_workspace_size", &flashcute::quantize_fp8_workspace_size, nb::arg("batch"), nb::arg("nheads"),
        nb::arg("block"), "Bytes of device workspace quantize_fp8 needs (0 with block scales).");
  m.def("forward_workspace_size", &forward_workspace_size, nb::arg("batch"), nb::arg("seqlen_q"),
        nb::arg("seqlen_k"), nb::arg("nheads"), nb::arg("nheads_kv"), nb::arg("headdim"),
        nb::arg("dtype"), nb::arg("causal"), nb::arg("backend"), nb::arg("device"),
        nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("alibi") = false,
        nb::arg("total_q") = -1, nb::arg("total_k") = -1, nb::arg("seqused_k") = false, nb::arg("headdim_v") = 0,
        nb::arg("dropout") = false,
        "Bytes of the optional device workspace the forward can use (0: none); total_q / total_k >= 0 "
        "for packed sides (seqlen_q / seqlen_k then the longest sequences'); headdim_v: v's (0: headdim); "
        "dropout: whether dropout_p > 0.");
  m.def("backward", &backward, nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        nb::arg("workspace"), nb::arg("softmax_scale"), nb::arg("causal"), nb::arg("deterministic"),
        nb::arg("backend"), nb::arg("stream"), nb::arg("window_left") = -1, nb::arg("window_right") = -1,
        nb::arg("softcap") = 0.f, nb::arg("alibi_slopes").none() = nb::none(),
        nb::arg("cu_seqlens_q").none() = nb::none(), nb::arg("cu_seqlens_k").none() = nb::none(),
        nb::arg("seqused_k").none() = nb::none(), nb::arg("max_seqlen_q") = 0, nb::arg("max_seqlen_k") = 0,
        nb::arg("dropout_p") = 0.f, nb::arg("dropout_seed") = 0, nb::arg("dropout_offset") = 0,
        nb::arg("dropout_rng_state").none() = nb::none(),
        "Attention backward into dq, dk, dv; cu_seqlens_q / cu_seqlens_k as in forward().");
  m.def("backward_workspace_size", &backward_workspace_size, nb::arg("batch"), nb::arg("seqlen_q"),
        nb::arg("seqlen_k"), nb::arg("nheads"), nb::arg("nheads_kv"), nb::arg("headdim"),
        nb::arg("dtype"), nb::arg("deterministic"), nb::arg("backend"), nb::arg("causal") = false,
        nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("total_q") = -1,
        nb::arg("total_k") = -1, nb::arg("seqused_k") = false,
        "Bytes of device workspace the backward needs; total_q / total_k as in forward_workspace_size().");
  m.def("_forward_split_plan", &forward_split_plan, nb::arg("units"), nb::arg("key_blocks"), nb::arg("sms"),
        nb::arg("partial_tiles") = false, nb::arg("few_rows") = false,
        "Test hook: the Hopper forward's last-wave split plan.");
  m.def("_forward_tile", &forward_tile, nb::arg("headdim"), nb::arg("seqlen_q"), nb::arg("seqlen_k"),
        nb::arg("causal"), "Test hook: the Hopper forward's (keys per block, consumers) for a call.");
  m.def("_forward_packed_heads", &forward_packed_heads, nb::arg("nheads"), nb::arg("nheads_kv"),
        nb::arg("seqlen_q"), nb::arg("seqlen_k"), nb::arg("headdim"), nb::arg("causal"), nb::arg("alibi") = false,
        "Test hook: query heads the Hopper forward packs into a tile's rows (1: none).");
  m.def("_dropout_keep_bits", &dropout_keep_bits, nb::arg("row"), nb::arg("key"), nb::arg("bh"), nb::arg("seed"),
        nb::arg("offset"), nb::arg("dropout_p"),
        "Test hook: the 8 keep bits (bit e: 4 * row bit 3 + 2 * key bit 3 + key bit 0) of the dropout group "
        "holding weight (row, key) of slice bh = b * nheads + h.");
  m.def("choose_kernel", &choose_kernel, nb::arg("backend"), nb::arg("capability"), nb::arg("headdim"),
        nb::arg("headdim_v") = 0, nb::arg("dtype") = "", nb::arg("backward") = false,
        nb::arg("deterministic") = false,
        "(backend, kernel head dim, kernel v head dim) that run a call on a GPU of this capability: the "
        "library's dispatch decision (headdim 0 / dtype '': any). ValueError names what no kernel runs; "
        "RuntimeError: a GPU older than sm80.");
  m.def("_choose_kernel_in", &choose_kernel_in, nb::arg("build"), nb::arg("backend"), nb::arg("capability"),
        nb::arg("headdim"), nb::arg("headdim_v") = 0, nb::arg("dtype") = "", nb::arg("backward") = false,
        nb::arg("deterministic") = false, nb::arg("kv_cache") = false, nb::arg("kv_seqlen_q") = 0,
        nb::arg("page_size") = 0,
        "Test hook: choose_kernel on a stand-in build's catalogue (kv_cache: an attention_with_kvcache call "
        "of kv_seqlen_q query rows per sequence, paged where page_size > 0).");
  m.def("_choose_kvcache_in", &choose_kvcache_in, nb::arg("build"), nb::arg("backend"), nb::arg("capability"),
        nb::arg("headdim"), nb::arg("kv_seqlen_q"), nb::arg("page_size"), nb::arg("kv_group"),
        nb::arg("kv_copy_bytes"),
        "Test hook: (backend, kernel head dim, copies_pages) of a bf16 KV-cache call on a stand-in build's "
        "catalogue, with kv_group query heads per K/V head and a page copy of kv_copy_bytes (0: none allowed).");
  m.def("device_capability", &device_capability, nb::arg("device"),
        "Compute capability of a CUDA device as major*10+minor.");
  m.def(
      "synchronize",
      [](uintptr_t stream, int device) {
        flashcute::Status status;
        {
          nb::gil_scoped_release release;
          status = flashcute::synchronize_stream(device, reinterpret_cast<cudaStream_t>(stream));
        }
        raise_on_error(status);
      },
      nb::arg("stream"), nb::arg("device") = -1, "Wait for the work queued on a CUDA stream.");
  m.def("default_backend", [](int capability) {
    return flashcute::default_backend(capability) == flashcute::Backend::kHopper ? "hopper"
                                                                                   : "ampere";
  });
  m.def("build_info", []() {
    const flashcute::BuildInfo info = flashcute::build_info();
    nb::dict d;
    d["version"] = info.version;
    d["cuda_archs"] = info.cuda_archs;
    d["ampere_head_dims"] = info.ampere_head_dims;
    d["ampere_dtypes"] = info.ampere_dtypes;
    d["hopper_head_dims"] = info.hopper_head_dims;
    d["hopper_dtypes"] = info.hopper_dtypes;
    d["hopper_backward_head_dims"] = info.hopper_backward_head_dims;
    d["hopper_dv_pairs"] = info.hopper_dv_pairs;
    d["hopper_fp8_head_dims"] = info.hopper_fp8_head_dims;
    d["ampere_sm80_only"] = info.ampere_sm80_only;
    d["cuda_runtime_version"] = info.cuda_runtime_version;
    return d;
  });
  m.attr("BACKEND_AUTO") = static_cast<int>(flashcute::Backend::kAuto);
  m.attr("BACKEND_AMPERE") = static_cast<int>(flashcute::Backend::kAmpere);
  m.attr("BACKEND_HOPPER") = static_cast<int>(flashcute::Backend::kHopper);
#ifdef FLASHCUTE_XLA_FFI
  add_xla_ffi_targets(m);
#endif
}
