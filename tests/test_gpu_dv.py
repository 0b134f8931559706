"""Calls whose v head dim differs from q's and k's (d_v != d) on an sm90 GPU: the Hopper path's
(192, 128) forward kernel, and its backward on the Hopper backward kernel at least as wide as
both head dims, against the float64 reference by the rules of test_gpu_forward.py and
test_gpu_backward.py (at most twice PyTorch's own error at the input precision).

Covered: both dtypes, odd lengths, causal with seqlen_q != seqlen_k, GQA, sliding windows,
softcap, ALiBi, packed query heads (decoding), the split last wave, call head dims below the
kernel's, variable-length batches, NaN-poisoned outputs (nothing unwritten, nothing past v's
columns written), autograd; and the refusals: a deterministic backward and backend="ampere"
raise a ValueError naming v.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
from flashcute import reference  # noqa: E402

from test_gpu_forward import LSE_ATOL, LSE_RTOL, OUT_ABS_FLOOR, SUPPORT, gen  # noqa: E402,F401
from test_gpu_masks import check_grads, visible_keys  # noqa: E402

pytestmark = pytest.mark.gpu

PAIR = (192, 128)


def _hopper(key: str) -> list:
    if "hopper" not in SUPPORT:  # not sm90, or no Hopper path in this build
        return []
    return list(flashcute.build_info()["backends"]["hopper"][key])


FORWARD = list(PAIR) in [list(pair) for pair in _hopper("head_dim_pairs")]
BACKWARD = FORWARD and any(d >= max(PAIR) for d in _hopper("backward_head_dims"))
needs_forward = pytest.mark.skipif(not FORWARD, reason="needs sm90 and the Hopper (192, 128) kernel")
needs_backward = pytest.mark.skipif(not BACKWARD, reason="needs sm90, the (192, 128) kernel and a "
                                                         "Hopper backward kernel of hd >= 192")
# The dtypes this build compiled (a restricted build may leave one out).
DTYPES = [d for d in ("bfloat16", "float16") if d in _hopper("dtypes")] or ["bfloat16"]


def randn(gen, *shape, dtype):
    return torch.randn(shape, generator=gen, device="cuda", dtype=getattr(torch, dtype))


def make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, dtype, headdim=PAIR[0],
             headdim_v=PAIR[1]):
    return (randn(gen, batch, seqlen_q, nheads, headdim, dtype=dtype),
            randn(gen, batch, seqlen_k, nheads_kv, headdim, dtype=dtype),
            randn(gen, batch, seqlen_k, nheads_kv, headdim_v, dtype=dtype))


def poisoned_out(q, v, extra=0):
    """A NaN-filled out of (q's rows, v's head dim); with ``extra``, the first columns of a
    wider buffer, so that a write past v's head dim shows too."""
    buf = torch.full((*q.shape[:-1], v.shape[-1] + extra), math.nan, dtype=q.dtype, device=q.device)
    return buf[..., : v.shape[-1]], buf


def check_forward(out, lse, q, k, v, **mask):
    """out (and lse) against float64 by the project's rule; rows that see no key are 0."""
    window = mask.get("window", (-1, -1))
    softcap = mask.get("softcap", 0.0)
    ref, ref_lse = reference.attention(q, k, v, return_lse=True, dtype=torch.float64, **mask)
    low = reference.attention(q, k, v, dtype=q.dtype, **mask)
    assert out.shape == (*q.shape[:-1], v.shape[-1]) and out.dtype == q.dtype
    assert torch.isfinite(out).all(), "output has non-finite elements (unwritten or NaN)"
    empty = ~visible_keys(q.shape[1], k.shape[1], window, mask.get("causal", False), q.device).any(dim=1)
    assert (out[:, empty] == 0).all(), "rows with no visible key must be exactly 0"
    err = (out.double() - ref).abs().max().item()
    torch_err = (low.double() - ref).abs().max().item()
    assert err <= 2 * torch_err + OUT_ABS_FLOOR, (
        f"max |flashcute - float64| = {err:.3g} > 2 * torch's {q.dtype} error {torch_err:.3g}"
    )
    if lse is not None:
        assert torch.isneginf(lse[..., empty]).all()
        got, want = lse[..., ~empty].double(), ref_lse[..., ~empty]
        tol = LSE_ATOL + LSE_RTOL * want.abs() + softcap * 2.0**-10
        assert ((got - want).abs() <= tol).all(), "lse differs from the float64 reference"


# (batch, seqlen_q, seqlen_k, nheads, nheads_kv, mask): odd lengths, causal with
# seqlen_q != seqlen_k both ways, GQA, windows, softcap, decoding (packed query heads), calls
# whose last wave is split (fewer tiles than SMs with long keys).
FORWARD_CASES = [
    (2, 113, 113, 4, 4, {}),
    (2, 113, 257, 6, 2, {"causal": True}),
    (1, 300, 129, 4, 1, {"causal": True}),
    (2, 511, 1000, 4, 2, {"window": (64, 17)}),
    (1, 255, 255, 4, 2, {"softcap": 30.0}),
    (1, 200, 333, 4, 2, {"causal": True, "window": (100, 0), "softcap": 20.0}),
    (2, 1, 1027, 8, 1, {}),
    (1, 7, 4099, 16, 2, {}),
    (1, 777, 4096, 16, 16, {}),
]


def _case_id(case) -> str:
    batch, sq, sk, h, hkv, mask = case
    extra = "-".join(f"{k}{v}" for k, v in mask.items()).replace(" ", "")
    return f"b{batch}-q{sq}-k{sk}-h{h}kv{hkv}" + (f"-{extra}" if extra else "")


@needs_forward
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", FORWARD_CASES, ids=_case_id)
def test_forward(gen, dtype, case):
    batch, seqlen_q, seqlen_k, nheads, nheads_kv, mask = case
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, dtype)
    out, buf = poisoned_out(q, v, extra=8)
    result, lse = flashcute.attention(q, k, v, out=out, return_lse=True, **mask)
    assert result is out
    check_forward(out, lse, q, k, v, **mask)
    assert torch.isnan(buf[..., v.shape[-1]:]).all(), "columns past v's head dim were written"
    # The same call, allocating its output.
    again = flashcute.attention(q, k, v, **mask)
    assert again.shape == out.shape and torch.equal(again, out)


@needs_forward
@pytest.mark.parametrize("headdim, headdim_v", [(136, 64), (160, 120), (192, 8), (64, 128)])
def test_forward_smaller_head_dims_run_on_the_pair(gen, headdim, headdim_v):
    """Calls below the pair's head dims (multiples of 8) run on it, reading and writing only
    their own columns."""
    q, k, v = make_qkv(gen, 2, 97, 211, 4, 2, "bfloat16", headdim, headdim_v)
    out, buf = poisoned_out(q, v, extra=16)
    flashcute.attention(q, k, v, out=out, causal=True)
    check_forward(out, None, q, k, v, causal=True)
    assert torch.isnan(buf[..., headdim_v:]).all()


@needs_forward
def test_forward_alibi(gen):
    q, k, v = make_qkv(gen, 2, 200, 300, 4, 2, "bfloat16")
    slopes = torch.rand(2, 4, generator=gen, device="cuda", dtype=torch.float32) * 0.2
    out, lse = flashcute.attention(q, k, v, causal=True, alibi_slopes=slopes, return_lse=True)
    check_forward(out, lse, q, k, v, causal=True, alibi_slopes=slopes)


def _offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


@needs_forward
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_varlen(gen, dtype, causal):
    lengths_q, lengths_k = [1, 77, 130, 0, 257], [5, 77, 300, 9, 129]
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    q = randn(gen, total_q, 6, PAIR[0], dtype=dtype)
    k = randn(gen, total_k, 2, PAIR[0], dtype=dtype)
    v = randn(gen, total_k, 2, PAIR[1], dtype=dtype)
    # Unused key slots past seqused_k hold NaN: they must not reach the output.
    used = torch.tensor([5, 60, 300, 0, 100], dtype=torch.int32, device="cuda")
    cu_q, cu_k = _offsets(lengths_q), _offsets(lengths_k)
    for b in range(len(lengths_k)):
        start = int(cu_k[b]) + int(used[b])
        k[start: int(cu_k[b + 1])] = math.nan
        v[start: int(cu_k[b + 1])] = math.nan
    out = torch.full((total_q, 6, PAIR[1]), math.nan, dtype=q.dtype, device="cuda")
    flashcute.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), seqused_k=used,
                               causal=causal, out=out)
    ref = reference.attention_varlen(q, k, v, cu_q, cu_k, seqused_k=used, causal=causal)
    low = reference.attention_varlen(q, k, v, cu_q, cu_k, seqused_k=used, causal=causal, dtype=q.dtype)
    assert torch.isfinite(out).all()
    err = (out.double() - ref).abs().max().item()
    torch_err = (low.double() - ref).abs().max().item()
    assert err <= 2 * torch_err + OUT_ABS_FLOOR


BACKWARD_CASES = [
    (2, 113, 113, 4, 4, {}),
    (1, 113, 257, 6, 2, {"causal": True}),
    (1, 300, 129, 4, 1, {"causal": True}),
    (1, 255, 511, 4, 2, {"window": (64, 17)}),
    (1, 255, 255, 4, 2, {"softcap": 30.0}),
    (1, 1000, 1000, 2, 1, {}),
]


@needs_backward
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", BACKWARD_CASES, ids=_case_id)
def test_backward(gen, dtype, case):
    batch, seqlen_q, seqlen_k, nheads, nheads_kv, mask = case
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, dtype)
    dout = randn(gen, batch, seqlen_q, nheads, PAIR[1], dtype=dtype)
    out, lse = flashcute.attention(q, k, v, return_lse=True, **mask)
    bufs = [torch.full_like(x, math.nan) for x in (q, k, v)]
    grads = flashcute.attention_backward(dout, q, k, v, out, lse, dq=bufs[0], dk=bufs[1], dv=bufs[2],
                                         **mask)
    assert all(g is b for g, b in zip(grads, bufs))
    full = {"causal": False, "window": (-1, -1), "softcap": 0.0, **mask}
    check_grads(grads, q, k, v, dout, **full)


@needs_backward
def test_autograd(gen):
    q, k, v = make_qkv(gen, 2, 129, 190, 4, 2, "bfloat16")
    dout = randn(gen, 2, 129, 4, PAIR[1], dtype="bfloat16")
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    out = flashcute.attention(*leaves, causal=True)
    assert out.shape == dout.shape
    out.backward(dout)
    check_grads([x.grad for x in leaves], q, k, v, dout, causal=True, window=(-1, -1), softcap=0.0)


@needs_backward
@pytest.mark.parametrize("causal", [False, True])
def test_backward_varlen(gen, causal):
    lengths_q, lengths_k = [3, 130, 64], [70, 129, 1]
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    cu_q, cu_k = _offsets(lengths_q), _offsets(lengths_k)
    q = randn(gen, total_q, 4, PAIR[0], dtype="bfloat16")
    k = randn(gen, total_k, 2, PAIR[0], dtype="bfloat16")
    v = randn(gen, total_k, 2, PAIR[1], dtype="bfloat16")
    dout = randn(gen, total_q, 4, PAIR[1], dtype="bfloat16")
    args = (cu_q, cu_k, max(lengths_q), max(lengths_k))
    out, lse = flashcute.attention_varlen(q, k, v, *args, causal=causal, return_lse=True)
    grads = flashcute.attention_varlen_backward(dout, q, k, v, out, lse, *args, causal=causal)

    def ref_grads(dtype):
        leaves = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v)]
        reference.attention_varlen(*leaves, cu_q, cu_k, causal=causal, dtype=dtype).backward(dout.to(dtype))
        return [x.grad for x in leaves]

    exact, low = ref_grads(torch.float64), ref_grads(torch.bfloat16)
    scale = max(g.abs().max().item() for g in exact)
    for name, got, ref, lo, like in zip(("dq", "dk", "dv"), grads, exact, low, (q, k, v)):
        assert got.shape == like.shape and torch.isfinite(got).all(), name
        err = (got.double() - ref).abs().max().item()
        torch_err = (lo.double() - ref).abs().max().item()
        assert err <= 2 * torch_err + 1e-5 + 1e-4 * scale, f"{name}: {err:.3g} vs torch {torch_err:.3g}"


@needs_forward
def test_deterministic_and_ampere_name_v(gen):
    """Only the Hopper path runs these calls, and its backward adds dQ with atomics."""
    q, k, v = make_qkv(gen, 1, 65, 65, 2, 2, "bfloat16")
    with pytest.raises(ValueError, match=r"^v: head dim 128 differs from q's and k's 192"):
        flashcute.attention(q, k, v, backend="ampere")
    out, lse = flashcute.attention(q, k, v, return_lse=True)
    dout = torch.randn_like(out)
    with pytest.raises(ValueError, match=r"^v: head dim 128 differs .*deterministic=True"):
        flashcute.attention_backward(dout, q, k, v, out, lse, deterministic=True)
    with pytest.raises(ValueError, match=r"^v: head dim 128 differs from q's and k's 192"):
        flashcute.attention_backward(dout, q, k, v, out, lse, backend="ampere")


@needs_backward
@pytest.mark.parametrize("causal", [False, True])
def test_dropout(gen, causal):
    """Dropout (main's P hook) on the pair: forward and backward against the reference under
    the kernels' keep mask."""
    from test_gpu_dropout import OFFSET, SEED, check_grads as check_dropout_grads, keep_mask

    p = 0.17
    q, k, v = make_qkv(gen, 2, 131, 200, 4, 2, "bfloat16")
    dout = randn(gen, 2, 131, 4, PAIR[1], dtype="bfloat16")
    drop = dict(dropout_p=p, dropout_seed=SEED, dropout_offset=OFFSET)
    out, lse = flashcute.attention(q, k, v, causal=causal, return_lse=True, **drop)
    mask = keep_mask(2, 4, 131, 200, p)
    ref = reference.attention(q, k, v, causal=causal, dropout_p=p, dropout_mask=mask, dtype=torch.float64)
    low = reference.attention(q, k, v, causal=causal, dropout_p=p, dropout_mask=mask, dtype=q.dtype)
    assert out.shape == dout.shape and torch.isfinite(out).all()
    err = (out.double() - ref).abs().max().item()
    assert err <= 2 * (low.double() - ref).abs().max().item() + OUT_ABS_FLOOR
    grads = flashcute.attention_backward(dout, q, k, v, out, lse, causal=causal, **drop)
    check_dropout_grads(grads, q, k, v, dout, mask, p, causal=causal)
