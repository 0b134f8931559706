"""Head dims between the compiled ones, on a GPU: a call of head dim d (a multiple of 8 up to
256) runs the smallest compiled kernel of head dim >= d, reading and writing only d columns.

Checked against the float64 reference by the rules of test_gpu_forward.py and
test_gpu_backward.py, forward and backward, on every backend this GPU runs; plus two
properties of the rounding itself: columns past d of wider buffers are neither read (NaN
there would reach the results) nor written, and the forward equals, bit for bit, the same
kernel's call on inputs zero-padded to its head dim.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402

from test_gpu_backward import check_grads, randn_like  # noqa: E402
from test_gpu_forward import SUPPORT, check_close, gen, make_qkv, run_checked  # noqa: E402,F401

pytestmark = pytest.mark.gpu

# Between and at compiled head dims (32, 64, 96, 128, 192, 256 by default): below the
# smallest, one 16-byte chunk past a 64-column swizzle row, just below 256.
SAMPLE_HEAD_DIMS = [8, 16, 24, 40, 56, 64, 72, 80, 112, 128, 136, 160, 200, 224, 248, 256]


def _hopper_backward_dims() -> list[int]:
    if "hopper" not in SUPPORT:
        return []
    return list(flashcute.build_info()["backends"]["hopper"]["backward_head_dims"])


def _kernel_dim(compiled: list[int], headdim: int) -> int | None:
    return min((d for d in compiled if d >= headdim), default=None)


def _one_dtype(dtypes: list[str]) -> str:
    return "bfloat16" if "bfloat16" in dtypes else dtypes[0]


def _forward_cases(all_dtypes: bool = False):
    """(backend, headdim, dtype) for every sampled head dim a usable backend can run."""
    cases = []
    for backend, (dims, dtypes) in SUPPORT.items():
        for headdim in SAMPLE_HEAD_DIMS:
            kernel = _kernel_dim(dims, headdim)
            if kernel is None:
                continue
            for dtype in dtypes if all_dtypes else [_one_dtype(dtypes)]:
                cases.append(pytest.param(backend, headdim, dtype,
                                          id=f"{backend}-hd{headdim}on{kernel}-{dtype}"))
    return cases


def _backward_cases():
    """(backward backend, deterministic, headdim, dtype): the Hopper-path backward, the Ampere
    path's default design and its deterministic one, each where it has a kernel >= headdim."""
    cases = []
    families = []
    if _hopper_backward_dims():
        families.append(("hopper", False, _hopper_backward_dims(), SUPPORT["hopper"][1]))
    if "ampere" in SUPPORT:
        dims, dtypes = SUPPORT["ampere"]
        families += [("ampere", False, dims, dtypes), ("ampere", True, dims, dtypes)]
    for backend, deterministic, dims, dtypes in families:
        for headdim in SAMPLE_HEAD_DIMS:
            kernel = _kernel_dim(dims, headdim)
            if kernel is None:
                continue
            dtype = _one_dtype(dtypes)
            family = backend + ("-deterministic" if deterministic else "")
            name = f"{family}-hd{headdim}on{kernel}-{dtype}"
            cases.append(pytest.param(backend, deterministic, headdim, dtype, id=name))
    return cases


# (batch, seqlen_q, seqlen_k, nheads, nheads_kv): odd lengths, seqlen_q != seqlen_k both ways
# (causal rows with no key in the second), grouped-query attention.
_SHAPES = [(2, 133, 257, 6, 2), (2, 301, 77, 4, 1)]


@pytest.mark.parametrize("backend, headdim, dtype", _forward_cases(all_dtypes=True))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", _SHAPES, ids=["133x257-gqa3", "301x77-mqa4"])
def test_forward(gen, backend, headdim, dtype, causal, shape):
    """Into a NaN-poisoned out=, against float64 (out and lse)."""
    batch, seqlen_q, seqlen_k, nheads, nheads_kv = shape
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype)
    run_checked(q, k, v, causal=causal, backend=backend)


def _padded(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]))


@pytest.mark.parametrize("backend, headdim, dtype", _forward_cases())
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_equals_zero_padded_call(gen, backend, headdim, dtype, causal):
    """The rounded call computes exactly what its kernel computes on inputs zero-padded to the
    kernel's head dim (the zeros add nothing to any sum), at the same scale."""
    kernel = _kernel_dim(SUPPORT[backend][0], headdim)
    q, k, v = make_qkv(gen, 2, 200, 333, 6, 2, headdim, dtype)
    scale = 1.0 / math.sqrt(headdim)
    out, lse = flashcute.attention(q, k, v, causal=causal, return_lse=True, backend=backend)
    wide, wide_lse = flashcute.attention(*(_padded(x, kernel) for x in (q, k, v)), causal=causal,
                                         softmax_scale=scale, return_lse=True, backend=backend)
    assert torch.equal(out.view(torch.int16), wide[..., :headdim].view(torch.int16))
    assert torch.equal(lse.view(torch.int32), wide_lse.view(torch.int32))


# Decoding-like shapes whose last wave the Hopper path runs split (fwd_tail_split.h), where the
# merge of few rows writes O itself (one query row, GQA 4:1 unpacked: d % 64 != 0; 17 rows).
_SPLIT_SHAPES = [(1, 1, 30000, 8, 2), (3, 17, 9000, 4, 4)]


@pytest.mark.parametrize("headdim", [40, 72, 136, 200])
@pytest.mark.parametrize("shape", _SPLIT_SHAPES, ids=["1x30000", "17x9000"])
def test_forward_split_last_wave(gen, headdim, shape):
    dims, dtypes = SUPPORT.get("hopper", ([], []))
    if _kernel_dim(dims, headdim) is None:
        pytest.skip(f"no Hopper-path kernel for head dim >= {headdim} on this GPU")
    from flashcute._build_info import load_extension

    ext = load_extension()
    dtype = _one_dtype(dtypes)
    batch, seqlen_q, seqlen_k, nheads, nheads_kv = shape
    assert ext.forward_workspace_size(batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype,
                                      False, ext.BACKEND_HOPPER, -1) > 0, "the split is not planned"
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype)
    run_checked(q, k, v, causal=False, backend="hopper")


def _forward_backend_for(backward_backend: str) -> str | None:
    """A forward on the backward's path where this GPU runs it, else the default."""
    return backward_backend if backward_backend in SUPPORT else None


@pytest.mark.parametrize("backend, deterministic, headdim, dtype", _backward_cases())
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", _SHAPES, ids=["133x257-gqa3", "301x77-mqa4"])
def test_backward_into_poisoned_buffers(gen, backend, deterministic, headdim, dtype, causal, shape):
    """attention_backward on the named path into NaN-filled dq, dk, dv, against float64."""
    batch, seqlen_q, seqlen_k, nheads, nheads_kv = shape
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype)
    dout = randn_like(gen, q)
    with torch.no_grad():
        out, lse = flashcute.attention(q, k, v, causal=causal, return_lse=True,
                                       backend=_forward_backend_for(backend))
    bufs = [torch.full_like(x, math.nan) for x in (q, k, v)]
    grads = flashcute.attention_backward(dout, q, k, v, out, lse, causal=causal, dq=bufs[0],
                                         dk=bufs[1], dv=bufs[2], deterministic=deterministic,
                                         backend=backend)
    assert all(g is b for g, b in zip(grads, bufs))
    check_grads(grads, q, k, v, dout, causal=causal)


@pytest.mark.parametrize("backend, headdim, dtype", _forward_cases())
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_autograd(gen, backend, headdim, dtype, causal):
    """The autograd route: the forward on `backend`, the backward where dispatch sends it."""
    q, k, v = make_qkv(gen, 2, 133, 257, 6, 2, headdim, dtype)
    dout = randn_like(gen, q)
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    out = flashcute.attention(*leaves, causal=causal, backend=backend)
    out.backward(dout)
    check_grads([x.grad for x in leaves], q, k, v, dout, causal=causal)


def _wide(gen, shape, headdim, dtype, *, fill=None):
    """A (..., headdim) slice of a NaN-filled (..., headdim + 8) buffer, and the buffer; the
    slice holds normal samples unless `fill` is given (NaN: an output buffer)."""
    buf = torch.full((*shape, headdim + 8), math.nan, dtype=getattr(torch, dtype), device="cuda")
    if fill is None:
        buf[..., :headdim] = torch.randn((*shape, headdim), generator=gen, device="cuda",
                                         dtype=buf.dtype)
    return buf[..., :headdim], buf


@pytest.mark.parametrize("backend, deterministic, headdim, dtype", _backward_cases())
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_columns_past_the_head_dim_are_neither_read_nor_written(gen, backend, deterministic,
                                                                headdim, dtype, causal):
    """q, k, v, dout, out, dq, dk, dv are column slices of wider NaN-filled buffers (rows
    16-byte aligned): the results are finite and right, and every column past the head dim
    still holds its NaN after the forward and the backward."""
    batch, seqlen_q, seqlen_k, nheads, nheads_kv = 2, 150, 211, 4, 2
    q_shape, kv_shape = (batch, seqlen_q, nheads), (batch, seqlen_k, nheads_kv)
    (q, qb), (k, kb), (v, vb) = (
        _wide(gen, s, headdim, dtype) for s in (q_shape, kv_shape, kv_shape))
    dout, doutb = _wide(gen, q_shape, headdim, dtype)
    (out, outb), (dq, dqb), (dk, dkb), (dv, dvb) = (
        _wide(gen, s, headdim, dtype, fill=math.nan)
        for s in (q_shape, q_shape, kv_shape, kv_shape))
    fwd_backend = _forward_backend_for(backend)
    result, lse = flashcute.attention(q, k, v, causal=causal, out=out, return_lse=True,
                                      backend=fwd_backend)
    assert result is out
    check_close(out, lse, q, k, v, causal=causal)
    flashcute.attention_backward(dout, q, k, v, out, lse, causal=causal, dq=dq, dk=dk, dv=dv,
                                 deterministic=deterministic, backend=backend)
    check_grads([dq, dk, dv], q, k, v, dout, causal=causal)
    for name, buf in (("q", qb), ("k", kb), ("v", vb), ("dout", doutb), ("out", outb), ("dq", dqb),
                      ("dk", dkb), ("dv", dvb)):
        assert torch.isnan(buf[..., headdim:]).all(), f"{name}: a column past the head dim changed"
