"""Sliding windows and softcap on a GPU, forward and backward, against flashcute.reference.

The accuracy rules are those of test_gpu_forward.py and test_gpu_backward.py: out and each of
dq, dk, dv may differ from the float64 reference by at most twice PyTorch's own error at the
input precision (plus small floors); the float32 lse is held to a fixed tolerance. PyTorch's
gradient error is the larger of autograd through ``reference.attention(..., dtype=q.dtype)``
and the FlashAttention backward formula with the window's mask and softcap's derivative
(``formula_grads``).

Masks are checked beyond the tolerances: a query row that sees no key gives exactly 0 and
lse -inf (and dq exactly 0), a key no query sees gets dk and dv exactly 0, and every output
buffer starts NaN-filled. The visible set is computed here from the documented rule, apart
from the reference: query i sees key j iff i + sk - sq - left <= j <= i + sk - sq + right
(-1 unbounded, causal sets right = 0).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
from flashcute import reference  # noqa: E402

from test_gpu_backward import (  # noqa: E402
    ABS_FLOOR, BWD_DTYPES, BWD_HEAD_DIMS, HOPPER_BWD_HEAD_DIMS, REL_FLOOR, randn_like,
)
from test_gpu_forward import (  # noqa: E402,F401
    LSE_ATOL, LSE_RTOL, OUT_ABS_FLOOR, SUPPORT, check_claimed_order, gen, make_qkv, poisoned_like,
)

pytestmark = pytest.mark.gpu

MAIN_HEAD_DIMS = (64, 128)
OTHER_HEAD_DIMS = (32, 96, 192, 256)
NO_WINDOW = (-1, -1)


# ---------------------------------------------------------------------------------------
# Checks.


def visible_keys(seqlen_q: int, seqlen_k: int, window, causal: bool, device) -> torch.Tensor:
    """(seqlen_q, seqlen_k) bool: which keys each query row sees, by the documented rule."""
    left, right = window
    if causal:
        right = 0
    rows = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    cols = torch.arange(seqlen_k, device=device)[None, :]
    seen = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        seen &= cols >= rows - left
    if right >= 0:
        seen &= cols <= rows + right
    return seen


def check_forward(out, lse, q, k, v, *, causal, window, softcap, softmax_scale=None,
                  alibi_slopes=None) -> int:
    """Assert out (and lse unless None) against float64; return the number of empty rows."""
    batch, seqlen_q, nheads, _ = q.shape
    mask = dict(causal=causal, window=window, softcap=softcap, softmax_scale=softmax_scale,
                alibi_slopes=alibi_slopes)
    ref, ref_lse = reference.attention(q, k, v, return_lse=True, dtype=torch.float64, **mask)
    low = reference.attention(q, k, v, dtype=q.dtype, **mask)
    empty = ~visible_keys(seqlen_q, k.shape[1], window, causal, q.device).any(dim=1)
    # The test's own mask and the reference agree on which rows see nothing.
    assert torch.equal(torch.isneginf(ref_lse), empty.expand_as(ref_lse))

    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.isfinite(out).all(), "output has non-finite elements (unwritten or NaN)"
    assert (out[:, empty] == 0).all(), "rows with no visible key must be exactly 0"
    if out.numel():
        err = (out.double() - ref).abs().max().item()
        torch_err = (low.double() - ref).abs().max().item()
        assert err <= 2 * torch_err + OUT_ABS_FLOOR, (
            f"max |flashcute - float64| = {err:.3g} > 2 * torch's {q.dtype} error "
            f"{torch_err:.3g} + {OUT_ABS_FLOOR}"
        )
    if lse is not None:
        assert lse.dtype == torch.float32 and lse.shape == (batch, nheads, seqlen_q)
        assert not torch.isnan(lse).any(), "lse has NaN"
        assert torch.isneginf(lse[..., empty]).all(), "rows with no visible key need lse -inf"
        got, want = lse[..., ~empty], ref_lse[..., ~empty]
        assert torch.isfinite(got).all()
        if got.numel():
            err = (got.double() - want).abs()
            # The kernels' tanh (tanh.approx.f32) is good to about 2^-11 relative, so a
            # capped score, and with it the lse, may be off by up to softcap * 2^-10.
            tol = LSE_ATOL + LSE_RTOL * want.abs() + softcap * 2.0**-10
            worst = (err - tol).argmax()
            assert (err <= tol).all(), (
                f"lse: |flashcute - float64| = {err.flatten()[worst].item():.3g} exceeds "
                f"{tol.flatten()[worst].item():.3g}"
            )
    return int(empty.sum())


def ref_grads(q, k, v, dout, *, dtype, **mask):
    leaves = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v)]
    out = reference.attention(*leaves, dtype=dtype, **mask)
    out.backward(dout.to(out.dtype))
    return [x.grad for x in leaves]


def formula_grads(q, k, v, dout, *, causal, window, softcap, softmax_scale=None,
                  alibi_slopes=None):
    """dq, dk, dv by the FlashAttention backward formula in PyTorch, matmuls in q's dtype:
    dS = P ∘ (dP - rowsum(dO ∘ O)) with O rounded to q's dtype, times softcap's derivative
    1 - tanh² where softcap is on; ALiBi's bias enters P only."""
    dtype, nheads, headdim = q.dtype, q.shape[2], q.shape[3]
    group = nheads // max(k.shape[2], 1)
    scale = 1.0 / math.sqrt(headdim) if softmax_scale is None else softmax_scale
    out, lse = reference.attention(q, k, v, causal=causal, window=window, softcap=softcap,
                                   softmax_scale=scale, return_lse=True, dtype=dtype,
                                   alibi_slopes=alibi_slopes)
    qt, ot, dot = (x.transpose(1, 2) for x in (q, out.to(dtype), dout))
    kt, vt = (x.transpose(1, 2).repeat_interleave(group, dim=1) for x in (k, v))
    scores = torch.matmul(qt, kt.transpose(-1, -2)).float() * scale
    if softcap > 0:
        tanh = torch.tanh(scores / softcap)
        scores = softcap * tanh
    if alibi_slopes is not None:
        diag = torch.arange(q.shape[1], device=q.device)[:, None] + (k.shape[1] - q.shape[1])
        dist = (diag - torch.arange(k.shape[1], device=q.device)[None, :]).abs().float()
        scores = scores - alibi_slopes.float()[..., None, None] * dist
    seen = visible_keys(q.shape[1], k.shape[1], window, causal, q.device)
    scores = scores.masked_fill(~seen, float("-inf"))
    finite_lse = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)
    p = torch.exp(scores - finite_lse.unsqueeze(-1))
    dp = torch.matmul(dot, vt.transpose(-1, -2)).float()
    row_dot = (dot.float() * ot.float()).sum(-1, keepdim=True)
    ds = p * (dp - row_dot)
    if softcap > 0:
        ds = ds * (1 - tanh * tanh)
    ds = ds.to(dtype)
    dq = torch.matmul(ds, kt).float() * scale
    dk = torch.matmul(ds.transpose(-1, -2), qt).float() * scale
    dv = torch.matmul(p.to(dtype).transpose(-1, -2), dot).float()

    def to_layout(g, heads):
        g = g.reshape(g.shape[0], heads, -1, *g.shape[2:]).sum(2) if heads != g.shape[1] else g
        return g.transpose(1, 2).to(dtype)

    return dq.transpose(1, 2).to(dtype), to_layout(dk, k.shape[2]), to_layout(dv, k.shape[2])


def check_grads(grads, q, k, v, dout, *, causal, window, softcap, softmax_scale=None,
                alibi_slopes=None):
    """Assert dq, dk, dv against float64 autograd; return (empty query rows, unseen keys)."""
    mask = dict(causal=causal, window=window, softcap=softcap, softmax_scale=softmax_scale,
                alibi_slopes=alibi_slopes)
    exact = ref_grads(q, k, v, dout, dtype=torch.float64, **mask)
    autograd_low = ref_grads(q, k, v, dout, dtype=q.dtype, **mask)
    formula_low = formula_grads(q, k, v, dout, **mask)
    seen = visible_keys(q.shape[1], k.shape[1], window, causal, q.device)
    empty_rows, unseen_keys = ~seen.any(dim=1), ~seen.any(dim=0)
    scale = max((g.abs().max().item() for g in exact if g.numel()), default=0.0)
    for name, got, ref, lowa, lowf, like in zip("qkv", grads, exact, autograd_low, formula_low,
                                                 (q, k, v)):
        name = "d" + name
        assert got.shape == like.shape and got.dtype == like.dtype, name
        assert torch.isfinite(got).all(), f"{name} has non-finite elements (unwritten or NaN)"
        zero = empty_rows if name == "dq" else unseen_keys
        assert (got[:, zero] == 0).all(), f"{name}: rows of no seen (query, key) pair must be 0"
        if not got.numel():
            continue
        err = (got.double() - ref).abs().max().item()
        torch_err = max((lowa.double() - ref).abs().max().item(),
                        (lowf.double() - ref).abs().max().item())
        bound = 2 * torch_err + ABS_FLOOR + REL_FLOOR * scale
        assert err <= bound, (
            f"{name}: max |flashcute - float64| = {err:.3g} > bound {bound:.3g} "
            f"(torch's {q.dtype} error {torch_err:.3g})"
        )
    return int(empty_rows.sum()), int(unseen_keys.sum())


# ---------------------------------------------------------------------------------------
# Calls.


def run_forward(q, k, v, *, backend, causal, window, softcap, softmax_scale=None,
                alibi_slopes=None):
    """Forward into a NaN-poisoned out= with lse, checked; returns (out, lse, empty rows)."""
    out = poisoned_like(q)
    result, lse = flashcute.attention(
        q, k, v, causal=causal, softmax_scale=softmax_scale, window=window, softcap=softcap,
        alibi_slopes=alibi_slopes, return_lse=True, out=out, backend=backend,
    )
    assert result is out
    empty = check_forward(result, lse, q, k, v, causal=causal, window=window, softcap=softcap,
                          softmax_scale=softmax_scale, alibi_slopes=alibi_slopes)
    return result, lse, empty


def run_backward(q, k, v, dout, *, backend, causal, window, softcap, softmax_scale=None,
                 deterministic=False, alibi_slopes=None):
    """attention_backward into NaN-poisoned dq, dk, dv after a forward with the same mask."""
    mask = dict(causal=causal, window=window, softcap=softcap, softmax_scale=softmax_scale,
                alibi_slopes=alibi_slopes)
    with torch.no_grad():
        out, lse = flashcute.attention(q, k, v, return_lse=True, **mask)
    bufs = [torch.full_like(x, math.nan) for x in (q, k, v)]
    grads = flashcute.attention_backward(
        dout, q, k, v, out, lse, dq=bufs[0], dk=bufs[1], dv=bufs[2],
        deterministic=deterministic, backend=backend, **mask,
    )
    assert all(g is b for g, b in zip(grads, bufs))
    return grads


def autograd_grads(q, k, v, dout, *, backend, causal, window, softcap, softmax_scale=None,
                   deterministic=False, alibi_slopes=None):
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    out = flashcute.attention(*leaves, causal=causal, window=window, softcap=softcap,
                              softmax_scale=softmax_scale, backend=backend,
                              deterministic=deterministic, alibi_slopes=alibi_slopes)
    assert out.requires_grad
    out.backward(dout)
    return out.detach(), [x.grad for x in leaves]


def _fwd_backends(headdim: int) -> list[str]:
    """Forward paths this build and GPU run for a head dim."""
    return [name for name, (head_dims, _) in SUPPORT.items() if headdim in head_dims]


def _bwd_backends(headdim: int) -> list[str]:
    """Backward paths this build and GPU run for a head dim, named explicitly."""
    names = ["hopper"] if headdim in HOPPER_BWD_HEAD_DIMS else []
    return names + (["ampere"] if headdim in BWD_HEAD_DIMS else [])


def _mask_id(causal: bool, window, softcap: float) -> str:
    text = f"{'causal' if causal else 'full'}-w{window[0]}_{window[1]}"
    return text + (f"-cap{softcap:g}" if softcap else "")


def _case_ids(cases) -> list[str]:
    """Ids of (seqlen_q, seqlen_k, window, causal, softcap) cases."""
    return [f"{c[0]}x{c[1]}-{_mask_id(c[3], c[2], c[4])}" for c in cases]


# ---------------------------------------------------------------------------------------
# Sliding windows: every window shape against seqlen_q != seqlen_k both ways, GQA.

# (seqlen_q, seqlen_k, nheads_kv of 6 query heads, two window sizes to use). sq > sk leaves
# leading rows without a key under (w, 0) and causal; sq < sk leaves keys no row sees.
RAGGED = [(113, 301, 2, (1, 100)), (300, 97, 3, (17, 256)), (1, 257, 3, (100, 1)),
          (257, 1, 2, (256, 17))]


def _windows(w_pair) -> list[tuple[int, int]]:
    windows = [(0, 0)]
    for w in w_pair:
        windows += [(w, 0), (w, w), (w, -1), (-1, w)]
    return windows


def _window_cases(forward: bool):
    """(backend, headdim, dtype, seqlen_q, seqlen_k, nheads_kv, window, causal) params."""
    cases = []
    for headdim in MAIN_HEAD_DIMS:
        backends = _fwd_backends(headdim) if forward else _bwd_backends(headdim)
        for backend in backends:
            kinds = SUPPORT[backend][1] if forward else BWD_DTYPES
            index = 0
            for seqlen_q, seqlen_k, nheads_kv, w_pair in RAGGED:
                # The backward takes one window size per shape: the forward covers both.
                windows = _windows(w_pair if forward else w_pair[:1])
                for window in windows:
                    index += 1
                    for causal in (False, True):
                        # Alternate dtypes over windows and causal alike.
                        dtype = kinds[(index + causal) % len(kinds)]
                        cases.append(pytest.param(
                            backend, headdim, dtype, seqlen_q, seqlen_k, nheads_kv, window, causal,
                            id=f"{backend}-hd{headdim}-{dtype}-{seqlen_q}x{seqlen_k}-"
                            f"{_mask_id(causal, window, 0.0)}",
                        ))
    return cases


@pytest.mark.parametrize("backend, headdim, dtype, seqlen_q, seqlen_k, nheads_kv, window, causal",
                         _window_cases(forward=True))
def test_forward_window(gen, backend, headdim, dtype, seqlen_q, seqlen_k, nheads_kv, window,
                        causal):
    q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, 6, nheads_kv, headdim, dtype)
    run_forward(q, k, v, backend=backend, causal=causal, window=window, softcap=0.0)


@pytest.mark.parametrize("backend, headdim, dtype, seqlen_q, seqlen_k, nheads_kv, window, causal",
                         _window_cases(forward=False))
def test_backward_window(gen, backend, headdim, dtype, seqlen_q, seqlen_k, nheads_kv, window,
                         causal):
    q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, 6, nheads_kv, headdim, dtype)
    dout = randn_like(gen, q)
    grads = run_backward(q, k, v, dout, backend=backend, causal=causal, window=window, softcap=0.0)
    check_grads(grads, q, k, v, dout, causal=causal, window=window, softcap=0.0)


# Windows at the bounds where a side stops masking anything (left >= seqlen_k - 1 or
# right >= seqlen_q - 1 reach past every key), just inside them, far past them, and one
# whose band has the width of the length difference.
def _edge_cases():
    cases = []
    for backend, (head_dims, dtypes) in SUPPORT.items():
        headdim = 128 if 128 in head_dims else head_dims[-1]
        for seqlen_q, seqlen_k in ((150, 333), (333, 150)):
            windows = [(seqlen_k - 2, seqlen_q - 2), (seqlen_k - 1, seqlen_q - 1),
                       (seqlen_k, seqlen_q), (seqlen_k + 1000, 0), (0, seqlen_q + 1000),
                       (max(seqlen_k - seqlen_q, 0), max(seqlen_q - seqlen_k, 0))]
            for index, window in enumerate(windows):
                dtype = dtypes[index % len(dtypes)]
                cases.append(pytest.param(
                    backend, headdim, dtype, seqlen_q, seqlen_k, window,
                    id=f"{backend}-hd{headdim}-{dtype}-{seqlen_q}x{seqlen_k}-"
                    f"{_mask_id(False, window, 0.0)}",
                ))
    return cases


@pytest.mark.parametrize("backend, headdim, dtype, seqlen_q, seqlen_k, window", _edge_cases())
def test_forward_window_at_the_clip_bounds(gen, backend, headdim, dtype, seqlen_q, seqlen_k,
                                           window):
    q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, 4, 2, headdim, dtype)
    run_forward(q, k, v, backend=backend, causal=False, window=window, softcap=0.0)


@pytest.mark.parametrize("backend", _bwd_backends(128) or _bwd_backends(BWD_HEAD_DIMS[-1]))
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(150, 333), (333, 150)], ids=["150x333", "333x150"])
@pytest.mark.parametrize("beyond", [-1, 0], ids=["inside", "at"])
def test_backward_window_at_the_clip_bounds(gen, backend, seqlen_q, seqlen_k, beyond):
    """(seqlen_k - 1, seqlen_q - 1) masks nothing yet is a band by its numbers; (seqlen_k,
    seqlen_q) is no band at all."""
    headdim = 128 if 128 in BWD_HEAD_DIMS else BWD_HEAD_DIMS[-1]
    window = (seqlen_k + beyond, seqlen_q + beyond)
    q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, 4, 2, headdim, BWD_DTYPES[-1])
    dout = randn_like(gen, q)
    grads = run_backward(q, k, v, dout, backend=backend, causal=False, window=window, softcap=0.0)
    check_grads(grads, q, k, v, dout, causal=False, window=window, softcap=0.0)


# ---------------------------------------------------------------------------------------
# Rows without a visible key, keys without a query.

# (seqlen_q, seqlen_k, window, causal, empty rows, unseen keys)
EMPTY_CASES = [
    (257, 1, (0, 0), True, 256, 0),
    (300, 97, (0, 0), False, 203, 0),
    (300, 97, (17, 0), True, 203, 0),
    (300, 97, (5, 2), False, 201, 0),
    (1, 257, (17, 0), False, 0, 239),
    (113, 301, (1, -1), True, 0, 187),
    (113, 301, (100, 3), False, 0, 88),
]


@pytest.mark.parametrize("seqlen_q, seqlen_k, window, causal, n_empty, n_unseen", EMPTY_CASES,
                         ids=[f"{c[0]}x{c[1]}-{_mask_id(c[3], c[2], 0.0)}" for c in EMPTY_CASES])
def test_empty_rows_and_unseen_keys(gen, seqlen_q, seqlen_k, window, causal, n_empty, n_unseen):
    """Zeros and lse -inf for rows that see nothing; zero gradients for rows and keys outside
    every (query, key) pair; forward on each path, backward on each path, with softcap too."""
    for softcap in (0.0, 30.0):
        for backend, (head_dims, dtypes) in SUPPORT.items():
            headdim = 64 if 64 in head_dims else head_dims[0]
            q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, 6, 2, headdim, dtypes[-1])
            _, _, empty = run_forward(q, k, v, backend=backend, causal=causal, window=window,
                                      softcap=softcap)
            assert empty == n_empty
        headdim = 64 if 64 in BWD_HEAD_DIMS else BWD_HEAD_DIMS[0]
        for backend in _bwd_backends(headdim):
            q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, 6, 2, headdim, BWD_DTYPES[-1])
            dout = randn_like(gen, q)
            grads = run_backward(q, k, v, dout, backend=backend, causal=causal, window=window,
                                 softcap=softcap)
            counts = check_grads(grads, q, k, v, dout, causal=causal, window=window,
                                 softcap=softcap)
            assert counts == (n_empty, n_unseen)


@pytest.mark.parametrize("backend", list(SUPPORT))
def test_no_keys_with_window_and_softcap(gen, backend):
    head_dims, dtypes = SUPPORT[backend]
    q, k, v = make_qkv(gen, 2, 7, 0, 4, 2, head_dims[0], dtypes[0])
    out = poisoned_like(q)
    result, lse = flashcute.attention(q, k, v, window=(3, 0), softcap=20.0, return_lse=True,
                                      out=out, backend=backend)
    assert result is out and (result == 0).all() and torch.isneginf(lse).all()


# ---------------------------------------------------------------------------------------
# Long rows: a masked right edge, an unmasked middle of key blocks, a masked left edge.

# (seqlen_q, seqlen_k, window, causal, softcap)
LONG_CASES = [
    (1000, 1000, (300, 200), False, 0.0),
    (1000, 1000, (300, 200), True, 0.0),
    (1000, 1500, (700, 500), False, 0.0),
    (1500, 1000, (256, 100), False, 30.0),
]


def _mask_cases(head_dims, table, forward: bool):
    """(backend, headdim, dtype, *case) for every path that runs each head dim."""
    cases = []
    for headdim in head_dims:
        backends = _fwd_backends(headdim) if forward else _bwd_backends(headdim)
        for backend in backends:
            dtypes = SUPPORT[backend][1] if forward else BWD_DTYPES
            for index, (seqlen_q, seqlen_k, window, causal, softcap) in enumerate(table):
                dtype = dtypes[index % len(dtypes)]
                cases.append(pytest.param(
                    backend, headdim, dtype, seqlen_q, seqlen_k, window, causal, softcap,
                    id=f"{backend}-hd{headdim}-{dtype}-{seqlen_q}x{seqlen_k}-"
                    f"{_mask_id(causal, window, softcap)}",
                ))
    return cases


_MASK_ARGS = "backend, headdim, dtype, seqlen_q, seqlen_k, window, causal, softcap"


def _forward_case(gen, batch, nheads_kv, backend, headdim, dtype, seqlen_q, seqlen_k, window,
                  causal, softcap):
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, 6, nheads_kv, headdim, dtype)
    run_forward(q, k, v, backend=backend, causal=causal, window=window, softcap=softcap)


def _backward_case(gen, batch, nheads_kv, backend, headdim, dtype, seqlen_q, seqlen_k, window,
                   causal, softcap):
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, 6, nheads_kv, headdim, dtype)
    dout = randn_like(gen, q)
    grads = run_backward(q, k, v, dout, backend=backend, causal=causal, window=window,
                         softcap=softcap)
    check_grads(grads, q, k, v, dout, causal=causal, window=window, softcap=softcap)


@pytest.mark.parametrize(_MASK_ARGS, _mask_cases(MAIN_HEAD_DIMS, LONG_CASES, forward=True))
def test_forward_long_window(gen, backend, headdim, dtype, seqlen_q, seqlen_k, window, causal, softcap):
    _forward_case(gen, 1, 2, backend, headdim, dtype, seqlen_q, seqlen_k, window, causal, softcap)


@pytest.mark.parametrize(_MASK_ARGS, _mask_cases(MAIN_HEAD_DIMS, LONG_CASES, forward=False))
def test_backward_long_window(gen, backend, headdim, dtype, seqlen_q, seqlen_k, window, causal, softcap):
    _backward_case(gen, 1, 2, backend, headdim, dtype, seqlen_q, seqlen_k, window, causal, softcap)


# ---------------------------------------------------------------------------------------
# Softcap: alone, with a window, with causal, with GQA; q scaled up so tanh saturates.

# (seqlen_q, seqlen_k, nheads, nheads_kv, window, causal, softcap, q multiplier, softmax_scale)
SOFTCAP_CASES = [
    (200, 300, 4, 4, NO_WINDOW, False, 5.0, 8.0, None),
    (200, 300, 6, 2, NO_WINDOW, False, 50.0, 1.0, None),
    (300, 300, 6, 3, NO_WINDOW, True, 30.0, 1.0, None),
    (113, 301, 6, 2, (17, 17), False, 50.0, 1.0, None),
    (300, 97, 6, 3, (256, -1), True, 5.0, 8.0, None),
    (257, 333, 6, 2, (100, 0), False, 30.0, 64.0, None),
    (150, 200, 4, 2, (64, 64), True, 5.0, 1.0, 0.5),
    (1, 257, 6, 2, NO_WINDOW, False, 5.0, 8.0, None),
]


def _softcap_cases(forward: bool):
    cases = []
    for headdim in MAIN_HEAD_DIMS:
        backends = _fwd_backends(headdim) if forward else _bwd_backends(headdim)
        for backend in backends:
            dtypes = SUPPORT[backend][1] if forward else BWD_DTYPES
            for index, case in enumerate(SOFTCAP_CASES):
                seqlen_q, seqlen_k, nheads, nheads_kv, window, causal, softcap, boost, scale = case
                dtype = dtypes[index % len(dtypes)]
                cases.append(pytest.param(
                    backend, headdim, dtype, *case,
                    id=f"{backend}-hd{headdim}-{dtype}-{seqlen_q}x{seqlen_k}-h{nheads}_{nheads_kv}-"
                    f"{_mask_id(causal, window, softcap)}-q{boost:g}"
                    + (f"-scale{scale:g}" if scale else ""),
                ))
    return cases


_SOFTCAP_ARGS = ("backend, headdim, dtype, seqlen_q, seqlen_k, nheads, nheads_kv, window, causal, "
                 "softcap, boost, softmax_scale")


def _softcap_inputs(gen, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype, boost):
    q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype)
    return q * boost, k, v  # powers of two: exact in both dtypes


def _saturated_share(q, k, softcap, softmax_scale) -> float:
    """Share of scaled scores beyond 2·softcap, where tanh is within 2% of ±1."""
    group = q.shape[2] // k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[3]) if softmax_scale is None else softmax_scale
    kt = k.transpose(1, 2).repeat_interleave(group, dim=1).float()
    scores = torch.matmul(q.transpose(1, 2).float(), kt.transpose(-1, -2)) * scale
    return (scores.abs() > 2 * softcap).float().mean().item()


@pytest.mark.parametrize(_SOFTCAP_ARGS, _softcap_cases(forward=True))
def test_forward_softcap(gen, backend, headdim, dtype, seqlen_q, seqlen_k, nheads, nheads_kv,
                         window, causal, softcap, boost, softmax_scale):
    q, k, v = _softcap_inputs(gen, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype, boost)
    if boost > 1:
        assert _saturated_share(q, k, softcap, softmax_scale) > 0.1, "inputs do not saturate tanh"
    run_forward(q, k, v, backend=backend, causal=causal, window=window, softcap=softcap,
                softmax_scale=softmax_scale)


@pytest.mark.parametrize(_SOFTCAP_ARGS, _softcap_cases(forward=False))
def test_backward_softcap(gen, backend, headdim, dtype, seqlen_q, seqlen_k, nheads, nheads_kv,
                          window, causal, softcap, boost, softmax_scale):
    q, k, v = _softcap_inputs(gen, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype, boost)
    dout = randn_like(gen, q)
    grads = run_backward(q, k, v, dout, backend=backend, causal=causal, window=window,
                         softcap=softcap, softmax_scale=softmax_scale)
    check_grads(grads, q, k, v, dout, causal=causal, window=window, softcap=softcap,
                softmax_scale=softmax_scale)


@pytest.mark.parametrize("backend", list(SUPPORT))
def test_softcap_changes_the_result(gen, backend):
    """A cap that bites must change the output, and a huge cap must come close to none: the
    argument reaches the kernel and is not applied twice."""
    head_dims, dtypes = SUPPORT[backend]
    headdim = 128 if 128 in head_dims else head_dims[-1]
    q, k, v = _softcap_inputs(gen, 150, 200, 4, 2, headdim, dtypes[0], 8.0)
    plain = flashcute.attention(q, k, v, backend=backend)
    capped = flashcute.attention(q, k, v, softcap=5.0, backend=backend)
    loose = flashcute.attention(q, k, v, softcap=1e6, backend=backend)
    assert (capped.float() - plain.float()).abs().max().item() > 0.1
    check_forward(loose, None, q, k, v, causal=False, window=NO_WINDOW, softcap=1e6)
    check_forward(loose, None, q, k, v, causal=False, window=NO_WINDOW, softcap=0.0)


# ---------------------------------------------------------------------------------------
# The other compiled head dims: one small window case and one softcap case each.

# (seqlen_q, seqlen_k, window, causal, softcap)
SMALL_CASES = [(113, 301, (17, 17), False, 0.0), (300, 97, (100, 0), True, 30.0)]


@pytest.mark.parametrize(_MASK_ARGS, _mask_cases(OTHER_HEAD_DIMS, SMALL_CASES, forward=True))
def test_forward_other_head_dims(gen, backend, headdim, dtype, seqlen_q, seqlen_k, window, causal, softcap):
    _forward_case(gen, 2, 3, backend, headdim, dtype, seqlen_q, seqlen_k, window, causal, softcap)


@pytest.mark.parametrize(_MASK_ARGS, _mask_cases(OTHER_HEAD_DIMS, SMALL_CASES, forward=False))
def test_backward_other_head_dims(gen, backend, headdim, dtype, seqlen_q, seqlen_k, window, causal, softcap):
    _backward_case(gen, 2, 3, backend, headdim, dtype, seqlen_q, seqlen_k, window, causal, softcap)


# ---------------------------------------------------------------------------------------
# The autograd route: the forward's path picks the backward's, and both see the mask.

FWD_BACKENDS = [None] + (["ampere"] if "hopper" in SUPPORT else [])
# (seqlen_q, seqlen_k, window, causal, softcap)
AUTOGRAD_CASES = [(300, 97, (17, 0), True, 0.0), (113, 301, (100, 100), False, 30.0),
                  (333, 333, (-1, 64), False, 5.0)]


@pytest.mark.parametrize("fwd_backend", FWD_BACKENDS, ids=lambda b: f"fwd-{b or 'default'}")
@pytest.mark.parametrize("headdim", MAIN_HEAD_DIMS)
@pytest.mark.parametrize("seqlen_q, seqlen_k, window, causal, softcap", AUTOGRAD_CASES,
                         ids=_case_ids(AUTOGRAD_CASES))
def test_autograd_window_softcap(gen, fwd_backend, headdim, seqlen_q, seqlen_k, window, causal,
                                 softcap):
    if headdim not in BWD_HEAD_DIMS:
        pytest.skip(f"head dim {headdim} has no backward in this build")
    q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, 6, 2, headdim, BWD_DTYPES[0])
    dout = randn_like(gen, q)
    out, grads = autograd_grads(q, k, v, dout, backend=fwd_backend, causal=causal, window=window,
                                softcap=softcap)
    check_forward(out, None, q, k, v, causal=causal, window=window, softcap=softcap)
    check_grads(grads, q, k, v, dout, causal=causal, window=window, softcap=softcap)


# ---------------------------------------------------------------------------------------
# Deterministic backward with a window and softcap.

# (seqlen_q, seqlen_k, window, causal, softcap)
DETERMINISTIC_CASES = [(777, 1000, (100, 50), False, 30.0), (1000, 777, (256, 0), True, 5.0)]


@pytest.mark.parametrize("headdim", MAIN_HEAD_DIMS)
@pytest.mark.parametrize("seqlen_q, seqlen_k, window, causal, softcap", DETERMINISTIC_CASES,
                         ids=_case_ids(DETERMINISTIC_CASES))
def test_deterministic_backward(gen, headdim, seqlen_q, seqlen_k, window, causal, softcap):
    """Bitwise equal gradients across runs (the Ampere path's dQ pass), by name and by
    backend=None, and within the bound of the float64 gradients."""
    if headdim not in BWD_HEAD_DIMS:
        pytest.skip(f"head dim {headdim} has no Ampere-path backward in this build")
    q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, 4, 2, headdim, BWD_DTYPES[-1])
    dout = randn_like(gen, q)
    mask = dict(causal=causal, window=window, softcap=softcap)
    runs = [run_backward(q, k, v, dout, backend=backend, deterministic=True, **mask)
            for backend in ("ampere", "ampere", None)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    check_grads(runs[0], q, k, v, dout, **mask)
    # The autograd route with deterministic=True gives the same bits.
    _, grads = autograd_grads(q, k, v, dout, backend=None, deterministic=True, **mask)
    for a, b in zip(runs[0], grads):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


# ---------------------------------------------------------------------------------------
# torch.compile.


def test_torch_compile_fullgraph_window_softcap(gen):
    """A compiled step (custom ops) gives the eager route's output bit for bit, dK and dV bit
    for bit (reproducible on both paths), and gradients within the bound."""
    headdim = 128 if 128 in BWD_HEAD_DIMS else BWD_HEAD_DIMS[-1]
    dtype = "bfloat16" if "bfloat16" in BWD_DTYPES else BWD_DTYPES[0]
    mask = dict(causal=False, window=(64, 32), softcap=30.0)
    torch._dynamo.reset()
    q, k, v = make_qkv(gen, 2, 300, 333, 8, 2, headdim, dtype)
    dout = randn_like(gen, q)

    @torch.compile(fullgraph=True)
    def step(q, k, v):
        out = flashcute.attention(q, k, v, **mask)
        return out, (out.float() * dout.float()).sum()

    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    compiled_out, loss = step(*leaves)
    loss.backward()
    compiled = [x.grad for x in leaves]
    eager_out, eager = autograd_grads(q, k, v, dout, backend=None, **mask)

    assert torch.equal(compiled_out.detach().view(torch.int16), eager_out.view(torch.int16))
    check_forward(compiled_out.detach(), None, q, k, v, **mask)
    check_grads(compiled, q, k, v, dout, **mask)
    for a, b in zip(compiled[1:], eager[1:]):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


HOPPER_FWD_DIMS = sorted(SUPPORT["hopper"][0]) if "hopper" in SUPPORT else []


@pytest.mark.skipif(not HOPPER_FWD_DIMS, reason="no Hopper-path forward here")
@pytest.mark.parametrize("headdim", HOPPER_FWD_DIMS)
@pytest.mark.parametrize("window, causal", [((300, 0), True), ((250, 90), False), ((700, -1), False)])
def test_window_claimed_tile_order(gen, headdim, window, causal):
    """A window with a left side over more than two waves of tiles: the Hopper path asks for
    a workspace, claims its tiles from the last one, and gives bit for bit what the fixed
    order (no workspace) gives, eagerly and replayed from a CUDA graph."""
    from torch.utils.dlpack import to_dlpack

    from flashcute import _C as ext
    from flashcute._dispatch import choose_backend

    dtype = "bfloat16" if "bfloat16" in SUPPORT["hopper"][1] else "float16"
    batch, seqlen_q, seqlen_k, nheads, nheads_kv = 3, 1999, 2300, 16, 4
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype)
    device = q.device.index
    code = choose_backend("hopper", int(ext.device_capability(device)), headdim=headdim, dtype=dtype)
    nbytes = int(ext.forward_workspace_size(batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype,
                                            causal, code, device, window[0], window[1]))
    assert nbytes > 0, "a windowed call of many tiles asks for the claims' counter"

    def launch(out, lse, workspace):
        ext.forward(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out), to_dlpack(lse),
                    headdim ** -0.5, causal, code, torch.cuda.current_stream().cuda_stream,
                    None if workspace is None else to_dlpack(workspace), window[0], window[1])

    def fresh():
        return poisoned_like(q), torch.full((batch, nheads, seqlen_q), math.nan, device="cuda")

    fixed_out, fixed_lse = fresh()
    launch(fixed_out, fixed_lse, None)
    check_forward(fixed_out, fixed_lse, q, k, v, causal=causal, window=window, softcap=0.0)
    check_claimed_order(launch, fresh, (fixed_out, fixed_lse), nbytes)
