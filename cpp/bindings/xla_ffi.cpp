// XLA FFI handlers behind flashcute.jax: XLA's buffers in, the public C++ API underneath, on
// XLA's stream and device. Buffers are dense row-major (XLA's default layout). Leading dims
// before (seqlen, heads, headdim) are one batch, so a vmapped call (an extra leading axis on
// every input) runs as one launch. Trace-time checks with argument names live in
// python/flashcute/jax; these repeat what a bad call could otherwise turn into a wild access.
#include "xla_ffi.h"

#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>

#include "flashcute/flashcute.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
namespace nb = nanobind;

namespace {

// A q-like or k-like buffer as the params take it: (batch..., rows, heads, headdim), or packed
// (total, heads, headdim) with cu_seqlens, whose batch stride is 0.
struct Rows {
  int64_t batch = 0, rows = 0, heads = 0, headdim = 0;
  bool ok = false;
  int64_t head_stride() const { return headdim; }
  int64_t row_stride() const { return heads * headdim; }
  int64_t batch_stride(bool packed) const { return packed ? 0 : rows * heads * headdim; }
  bool same_rows(const Rows& o) const { return batch == o.batch && rows == o.rows && heads == o.heads; }
};

Rows rows_of(const ffi::AnyBuffer& buffer, bool packed) {
  const auto dims = buffer.dimensions();
  const int64_t rank = static_cast<int64_t>(dims.size());
  Rows r;
  if (packed ? rank != 3 : rank < 4) return r;
  r.batch = 1;
  for (int64_t i = 0; i + 3 < rank; ++i) r.batch *= dims[i];
  r.rows = dims[rank - 3], r.heads = dims[rank - 2], r.headdim = dims[rank - 1];
  r.ok = true;
  return r;
}

ffi::Error error_of(const flashcute::Status& status) {
  if (status.ok()) return ffi::Error::Success();
  const bool caller = status.code == flashcute::StatusCode::kInvalidArgument ||
                      status.code == flashcute::StatusCode::kNotSupported;
  return ffi::Error(caller ? ffi::ErrorCode::kInvalidArgument : ffi::ErrorCode::kInternal,
                    std::string("flashcute: ") + status.message);
}

ffi::Error invalid(const std::string& message) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "flashcute: " + message);
}

bool to_dtype(ffi::DataType t, flashcute::DType* dtype) {
  if (t == ffi::DataType::F16) return *dtype = flashcute::DType::kFloat16, true;
  if (t == ffi::DataType::BF16) return *dtype = flashcute::DType::kBFloat16, true;
  return false;
}

// The inputs every call may leave empty (a 0-element buffer): ALiBi slopes, the dropout rng
// state and the variable-length vectors.
struct Optional {
  ffi::AnyBuffer alibi, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_k;
  static const void* data(const ffi::AnyBuffer& b) { return b.element_count() == 0 ? nullptr : b.untyped_data(); }
  bool packed_q() const { return data(cu_seqlens_q) != nullptr; }
  bool packed_k() const { return data(cu_seqlens_k) != nullptr; }
};

// The scalar attributes forward and backward share.
struct Scalars {
  float softmax_scale, softcap, dropout_p;
  bool causal;
  int64_t window_left, window_right, max_seqlen_q, max_seqlen_k;
};

// Sizes, optional inputs and scalars into params (pointers and strides of the main tensors
// are the caller's). ALiBi slopes are (nheads,) or (batch..., nheads) float32; the rng state
// is {seed, offset} as four uint32 words, low word first; varlen vectors are int32.
template <class Params>
ffi::Error set_common(Params& p, const Rows& q, const Rows& k, const Rows& v, const Optional& o,
                      const Scalars& s) {
  if (!q.ok || !k.ok || !v.ok)
    return invalid("q, k, v: expected (batch..., seqlen, heads, headdim), or packed (total, heads, headdim) "
                   "with cu_seqlens");
  if (!v.same_rows(k) || k.headdim != q.headdim) return invalid("q, k, v: shapes do not match");
  const int64_t offsets_q = static_cast<int64_t>(o.cu_seqlens_q.element_count());
  const int64_t offsets_k = static_cast<int64_t>(o.cu_seqlens_k.element_count());
  int64_t batch = o.packed_q() ? offsets_q - 1 : o.packed_k() ? offsets_k - 1 : q.batch;
  if ((o.packed_q() && o.packed_k() && offsets_q != offsets_k) || (!o.packed_q() && q.batch != batch) ||
      (!o.packed_k() && k.batch != batch) || batch < (o.packed_q() || o.packed_k() ? 1 : 0))
    return invalid("cu_seqlens_q, cu_seqlens_k: expected batch + 1 offsets each, matching the batched tensors");
  for (const ffi::AnyBuffer* b : {&o.cu_seqlens_q, &o.cu_seqlens_k, &o.seqused_k})
    if (Optional::data(*b) != nullptr && b->element_type() != ffi::DataType::S32)
      return invalid("cu_seqlens_q, cu_seqlens_k, seqused_k: expected int32");
  if (Optional::data(o.seqused_k) != nullptr && static_cast<int64_t>(o.seqused_k.element_count()) != batch)
    return invalid("seqused_k: expected one entry per sequence (batch)");
  p.batch = batch;
  p.seqlen_q = o.packed_q() ? s.max_seqlen_q : q.rows;
  p.seqlen_k = o.packed_k() ? s.max_seqlen_k : k.rows;
  p.total_q = o.packed_q() ? q.rows : 0;
  p.total_k = o.packed_k() ? k.rows : 0;
  p.cu_seqlens_q = static_cast<const int32_t*>(Optional::data(o.cu_seqlens_q));
  p.cu_seqlens_k = static_cast<const int32_t*>(Optional::data(o.cu_seqlens_k));
  p.seqused_k = static_cast<const int32_t*>(Optional::data(o.seqused_k));
  p.nheads = q.heads, p.nheads_kv = k.heads, p.headdim = q.headdim, p.headdim_v = v.headdim;
  p.softmax_scale = s.softmax_scale, p.causal = s.causal, p.softcap = s.softcap;
  p.window_left = s.window_left, p.window_right = s.window_right;
  if (Optional::data(o.alibi) != nullptr) {
    const int64_t n = static_cast<int64_t>(o.alibi.element_count());
    if (o.alibi.element_type() != ffi::DataType::F32 || (n != q.heads && n != batch * q.heads))
      return invalid("alibi_slopes: expected float32 (nheads,) or (batch, nheads)");
    p.alibi_slopes = static_cast<const float*>(o.alibi.untyped_data());
    p.alibi_slopes_batch_stride = n == q.heads ? 0 : q.heads;
  }
  p.dropout_p = s.dropout_p;
  if (s.dropout_p > 0.f) {
    if (Optional::data(o.rng_state) == nullptr || o.rng_state.size_bytes() != 16)
      return invalid("dropout_rng_state: expected {seed, offset} as 4 uint32 words with dropout_p > 0");
    p.dropout_rng_state = static_cast<const int64_t*>(o.rng_state.untyped_data());
  }
  return ffi::Error::Success();
}

ffi::Error forward(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                   ffi::AnyBuffer alibi, ffi::AnyBuffer rng_state, ffi::AnyBuffer cu_seqlens_q,
                   ffi::AnyBuffer cu_seqlens_k, ffi::AnyBuffer seqused_k, ffi::Result<ffi::AnyBuffer> out,
                   ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> workspace, float softmax_scale,
                   bool causal, int64_t window_left, int64_t window_right, float softcap, float dropout_p,
                   int64_t max_seqlen_q, int64_t max_seqlen_k, int32_t backend) {
  const Optional o{alibi, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_k};
  const Scalars s{softmax_scale, softcap, dropout_p, causal, window_left, window_right, max_seqlen_q, max_seqlen_k};
  const bool pq = o.packed_q(), pk = o.packed_k();
  const Rows qr = rows_of(q, pq), kr = rows_of(k, pk), vr = rows_of(v, pk), outr = rows_of(*out, pq);
  flashcute::AttentionForwardParams p;
  if (ffi::Error e = set_common(p, qr, kr, vr, o, s); e.failure()) return e;
  if (!outr.ok || !outr.same_rows(qr) || outr.headdim != vr.headdim)
    return invalid("out: expected q's shape with v's head dim");
  if (!to_dtype(q.element_type(), &p.dtype) || k.element_type() != q.element_type() ||
      v.element_type() != q.element_type() || out->element_type() != q.element_type())
    return invalid("q, k, v, out: expected one dtype, float16 or bfloat16");
  // An empty lse result: the caller does not need it (a call that is not differentiated).
  const bool has_lse = lse->element_count() != 0;
  if (has_lse && (lse->element_type() != ffi::DataType::F32 ||
                  static_cast<int64_t>(lse->element_count()) != qr.batch * qr.heads * qr.rows))
    return invalid("lse: expected float32 (batch..., nheads, seqlen_q), or (nheads, total_q) when packed");
  p.q = q.untyped_data(), p.k = k.untyped_data(), p.v = v.untyped_data(), p.out = out->untyped_data();
  p.lse = has_lse ? static_cast<float*>(lse->untyped_data()) : nullptr;
  p.q_batch_stride = qr.batch_stride(pq), p.q_row_stride = qr.row_stride(), p.q_head_stride = qr.head_stride();
  p.k_batch_stride = kr.batch_stride(pk), p.k_row_stride = kr.row_stride(), p.k_head_stride = kr.head_stride();
  p.v_batch_stride = vr.batch_stride(pk), p.v_row_stride = vr.row_stride(), p.v_head_stride = vr.head_stride();
  p.out_batch_stride = outr.batch_stride(pq), p.out_row_stride = outr.row_stride();
  p.out_head_stride = outr.head_stride();
  p.lse_batch_stride = pq ? 0 : qr.heads * qr.rows;
  p.lse_head_stride = qr.rows;
  p.workspace = workspace->element_count() == 0 ? nullptr : workspace->untyped_data();
  p.workspace_bytes = p.workspace == nullptr ? 0 : workspace->size_bytes();
  p.device = device;
  p.stream = stream;
  return error_of(flashcute::attention_forward(p, static_cast<flashcute::Backend>(backend)));
}

ffi::Error backward(cudaStream_t stream, int32_t device, ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k,
                    ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer alibi,
                    ffi::AnyBuffer rng_state, ffi::AnyBuffer cu_seqlens_q, ffi::AnyBuffer cu_seqlens_k,
                    ffi::AnyBuffer seqused_k, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                    ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> workspace, float softmax_scale,
                    bool causal, int64_t window_left, int64_t window_right, float softcap, float dropout_p,
                    int64_t max_seqlen_q, int64_t max_seqlen_k, bool deterministic, int32_t backend) {
  const Optional o{alibi, rng_state, cu_seqlens_q, cu_seqlens_k, seqused_k};
  const Scalars s{softmax_scale, softcap, dropout_p, causal, window_left, window_right, max_seqlen_q, max_seqlen_k};
  const bool pq = o.packed_q(), pk = o.packed_k();
  const Rows qr = rows_of(q, pq), kr = rows_of(k, pk), vr = rows_of(v, pk);
  const Rows doutr = rows_of(dout, pq), outr = rows_of(out, pq), dqr = rows_of(*dq, pq);
  const Rows dkr = rows_of(*dk, pk), dvr = rows_of(*dv, pk);
  flashcute::AttentionBackwardParams p;
  if (ffi::Error e = set_common(p, qr, kr, vr, o, s); e.failure()) return e;
  for (const Rows* r : {&doutr, &outr})
    if (!r->ok || !r->same_rows(qr) || r->headdim != vr.headdim)
      return invalid("dout, out: expected q's shape with v's head dim");
  if (!dqr.ok || !dqr.same_rows(qr) || dqr.headdim != qr.headdim || !dkr.ok || !dkr.same_rows(kr) ||
      dkr.headdim != kr.headdim || !dvr.ok || !dvr.same_rows(vr) || dvr.headdim != vr.headdim)
    return invalid("dq, dk, dv: expected the shapes of q, k and v");
  const ffi::DataType t = q.element_type();
  if (!to_dtype(t, &p.dtype) || dout.element_type() != t || k.element_type() != t || v.element_type() != t ||
      out.element_type() != t || dq->element_type() != t || dk->element_type() != t || dv->element_type() != t)
    return invalid("dout, q, k, v, out, dq, dk, dv: expected one dtype, float16 or bfloat16");
  if (lse.element_type() != ffi::DataType::F32 ||
      static_cast<int64_t>(lse.element_count()) != qr.batch * qr.heads * qr.rows)
    return invalid("lse: expected the forward's float32 lse");
  p.dout = dout.untyped_data(), p.q = q.untyped_data(), p.k = k.untyped_data(), p.v = v.untyped_data();
  p.out = out.untyped_data(), p.lse = static_cast<const float*>(lse.untyped_data());
  p.dq = dq->untyped_data(), p.dk = dk->untyped_data(), p.dv = dv->untyped_data();
  p.dout_batch_stride = doutr.batch_stride(pq), p.dout_row_stride = doutr.row_stride();
  p.dout_head_stride = doutr.head_stride();
  p.q_batch_stride = qr.batch_stride(pq), p.q_row_stride = qr.row_stride(), p.q_head_stride = qr.head_stride();
  p.k_batch_stride = kr.batch_stride(pk), p.k_row_stride = kr.row_stride(), p.k_head_stride = kr.head_stride();
  p.v_batch_stride = vr.batch_stride(pk), p.v_row_stride = vr.row_stride(), p.v_head_stride = vr.head_stride();
  p.out_batch_stride = outr.batch_stride(pq), p.out_row_stride = outr.row_stride();
  p.out_head_stride = outr.head_stride();
  p.dq_batch_stride = dqr.batch_stride(pq), p.dq_row_stride = dqr.row_stride(), p.dq_head_stride = dqr.head_stride();
  p.dk_batch_stride = dkr.batch_stride(pk), p.dk_row_stride = dkr.row_stride(), p.dk_head_stride = dkr.head_stride();
  p.dv_batch_stride = dvr.batch_stride(pk), p.dv_row_stride = dvr.row_stride(), p.dv_head_stride = dvr.head_stride();
  p.lse_batch_stride = pq ? 0 : qr.heads * qr.rows;
  p.lse_head_stride = qr.rows;
  p.workspace = workspace->element_count() == 0 ? nullptr : workspace->untyped_data();
  p.workspace_bytes = p.workspace == nullptr ? 0 : workspace->size_bytes();
  p.deterministic = deterministic;
  p.device = device;
  p.stream = stream;
  return error_of(flashcute::attention_backward(p, static_cast<flashcute::Backend>(backend)));
}

// Both handlers launch only on XLA's stream and allocate nothing, so XLA may record them into
// command buffers (CUDA graphs).
XLA_FFI_DEFINE_HANDLER(kForward, forward,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Ctx<ffi::DeviceOrdinal>()
                           .Arg<ffi::AnyBuffer>()  // q
                           .Arg<ffi::AnyBuffer>()  // k
                           .Arg<ffi::AnyBuffer>()  // v
                           .Arg<ffi::AnyBuffer>()  // alibi_slopes
                           .Arg<ffi::AnyBuffer>()  // dropout rng state
                           .Arg<ffi::AnyBuffer>()  // cu_seqlens_q
                           .Arg<ffi::AnyBuffer>()  // cu_seqlens_k
                           .Arg<ffi::AnyBuffer>()  // seqused_k
                           .Ret<ffi::AnyBuffer>()  // out
                           .Ret<ffi::AnyBuffer>()  // lse
                           .Ret<ffi::AnyBuffer>()  // workspace
                           .Attr<float>("softmax_scale")
                           .Attr<bool>("causal")
                           .Attr<int64_t>("window_left")
                           .Attr<int64_t>("window_right")
                           .Attr<float>("softcap")
                           .Attr<float>("dropout_p")
                           .Attr<int64_t>("max_seqlen_q")
                           .Attr<int64_t>("max_seqlen_k")
                           .Attr<int32_t>("backend"),
                       {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER(kBackward, backward,
                       ffi::Ffi::Bind()
                           .Ctx<ffi::PlatformStream<cudaStream_t>>()
                           .Ctx<ffi::DeviceOrdinal>()
                           .Arg<ffi::AnyBuffer>()  // dout
                           .Arg<ffi::AnyBuffer>()  // q
                           .Arg<ffi::AnyBuffer>()  // k
                           .Arg<ffi::AnyBuffer>()  // v
                           .Arg<ffi::AnyBuffer>()  // out
                           .Arg<ffi::AnyBuffer>()  // lse
                           .Arg<ffi::AnyBuffer>()  // alibi_slopes
                           .Arg<ffi::AnyBuffer>()  // dropout rng state
                           .Arg<ffi::AnyBuffer>()  // cu_seqlens_q
                           .Arg<ffi::AnyBuffer>()  // cu_seqlens_k
                           .Arg<ffi::AnyBuffer>()  // seqused_k
                           .Ret<ffi::AnyBuffer>()  // dq
                           .Ret<ffi::AnyBuffer>()  // dk
                           .Ret<ffi::AnyBuffer>()  // dv
                           .Ret<ffi::AnyBuffer>()  // workspace
                           .Attr<float>("softmax_scale")
                           .Attr<bool>("causal")
                           .Attr<int64_t>("window_left")
                           .Attr<int64_t>("window_right")
                           .Attr<float>("softcap")
                           .Attr<float>("dropout_p")
                           .Attr<int64_t>("max_seqlen_q")
                           .Attr<int64_t>("max_seqlen_k")
                           .Attr<bool>("deterministic")
                           .Attr<int32_t>("backend"),
                       {ffi::Traits::kCmdBufferCompatible});

}  // namespace

void add_xla_ffi_targets(nb::module_& m) {
  m.def(
      "xla_ffi_targets",
      []() {
        nb::dict targets;
        targets["flashcute_attention_forward"] = nb::capsule(reinterpret_cast<void*>(kForward));
        targets["flashcute_attention_backward"] = nb::capsule(reinterpret_cast<void*>(kBackward));
        return targets;
      },
      "XLA FFI handlers (name: PyCapsule) for jax.ffi.register_ffi_target(platform='CUDA').");
  m.attr("XLA_FFI_API_VERSION") = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
}
