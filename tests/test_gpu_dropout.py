"""Dropout on a GPU, forward and backward, on every path this build runs, against
flashcute.reference in float64 under the kernels' exact keep mask.

The mask of a seed and offset is ``flashcute.testing.dropout_keep_mask`` (checked against the
C++ bits on the CPU, tests/test_dropout_api.py); the reference takes it as ``dropout_mask``, so
out, dq, dk and dv are held to test_gpu_masks.py's bounds (twice PyTorch's own error at the
input precision plus small floors), lse (before dropout) to its fixed tolerance, and every
output buffer starts NaN-filled. A gradient within the bound of the reference built from the
forward's mask shows that the backward regenerated that mask. The torch routes draw the seed
and offset from torch's CUDA generator: the tests replay the draw with
``flashcute.dropout_rng_state`` after ``torch.manual_seed`` to know the mask, and check that
calls, CUDA-graph replays and compiled steps each draw new values.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
import flashcute.testing  # noqa: E402
from flashcute import reference  # noqa: E402

from test_gpu_backward import (  # noqa: E402
    ABS_FLOOR, BWD_DTYPES, BWD_HEAD_DIMS, HOPPER_BWD_HEAD_DIMS, REL_FLOOR, randn_like,
)
from test_gpu_forward import (  # noqa: E402,F401
    LSE_ATOL, LSE_RTOL, OUT_ABS_FLOOR, SUPPORT, gen, make_qkv, poisoned_like,
)
from test_gpu_masks import NO_WINDOW, _mask_id, visible_keys  # noqa: E402

pytestmark = pytest.mark.gpu

SEED, OFFSET = 0x1234_5678_9ABC, 2**40 + 77  # both words of each matter


def keep_mask(batch, nheads, seqlen_q, seqlen_k, p, seed=SEED, offset=OFFSET) -> torch.Tensor:
    return flashcute.testing.dropout_keep_mask(batch, nheads, seqlen_q, seqlen_k, p, seed, offset,
                                               device="cuda")


def state_values(state: torch.Tensor) -> tuple[int, int]:
    seed, offset = state.tolist()
    return seed, offset


# ---------------------------------------------------------------------------------------
# Checks against the reference under a given mask.


def check_forward(out, lse, q, k, v, mask, p, **kw) -> None:
    """out (and lse unless None) against float64 attention with the keep mask."""
    ref, ref_lse = reference.attention(q, k, v, return_lse=True, dtype=torch.float64,
                                       dropout_p=p, dropout_mask=mask, **kw)
    low = reference.attention(q, k, v, dtype=q.dtype, dropout_p=p, dropout_mask=mask, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.isfinite(out).all(), "output has non-finite elements (unwritten or NaN)"
    if out.numel():
        err = (out.double() - ref).abs().max().item()
        torch_err = (low.double() - ref).abs().max().item()
        assert err <= 2 * torch_err + OUT_ABS_FLOOR, (
            f"max |flashcute - float64| = {err:.3g} > 2 * torch's {q.dtype} error "
            f"{torch_err:.3g} + {OUT_ABS_FLOOR}"
        )
    if lse is not None:
        seen = torch.isfinite(ref_lse)
        assert torch.equal(torch.isneginf(lse), ~seen)
        softcap = kw.get("softcap", 0.0)
        err = (lse[seen].double() - ref_lse[seen]).abs()
        tol = LSE_ATOL + LSE_RTOL * ref_lse[seen].abs() + softcap * 2.0**-10
        assert (err <= tol).all(), f"lse off by up to {err.max().item():.3g}"


def ref_grads(q, k, v, dout, mask, p, *, dtype, **kw):
    leaves = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v)]
    out = reference.attention(*leaves, dtype=dtype, dropout_p=p, dropout_mask=mask, **kw)
    out.backward(dout.to(out.dtype))
    return [x.grad for x in leaves]


def check_grads(grads, q, k, v, dout, mask, p, **kw) -> None:
    """dq, dk, dv against float64 autograd through the reference with the keep mask."""
    exact = ref_grads(q, k, v, dout, mask, p, dtype=torch.float64, **kw)
    low = ref_grads(q, k, v, dout, mask, p, dtype=q.dtype, **kw)
    scale = max((g.abs().max().item() for g in exact if g.numel()), default=0.0)
    for name, got, ref, lo, like in zip(("dq", "dk", "dv"), grads, exact, low, (q, k, v)):
        assert got.shape == like.shape and got.dtype == like.dtype, name
        assert torch.isfinite(got).all(), f"{name} has non-finite elements (unwritten or NaN)"
        if not got.numel():
            continue
        err = (got.double() - ref).abs().max().item()
        torch_err = (lo.double() - ref).abs().max().item()
        bound = 2 * torch_err + ABS_FLOOR + REL_FLOOR * scale
        assert err <= bound, (
            f"{name}: max |flashcute - float64| = {err:.3g} > bound {bound:.3g} "
            f"(torch's {q.dtype} error {torch_err:.3g})"
        )


def run_forward(q, k, v, p, *, backend, seed=SEED, offset=OFFSET, **kw):
    """Forward with an explicit seed into a NaN-poisoned out, checked; returns (out, lse)."""
    out = poisoned_like(q)
    result, lse = flashcute.attention(q, k, v, dropout_p=p, dropout_seed=seed,
                                      dropout_offset=offset, return_lse=True, out=out,
                                      backend=backend, **kw)
    assert result is out
    mask = keep_mask(q.shape[0], q.shape[2], q.shape[1], k.shape[1], p, seed, offset)
    check_forward(result, lse, q, k, v, mask, p, **kw)
    return result, lse


def run_backward(q, k, v, dout, p, *, backend, deterministic=False, **kw):
    """attention_backward into NaN-poisoned buffers after a forward with the same seed."""
    with torch.no_grad():
        out, lse = flashcute.attention(q, k, v, dropout_p=p, dropout_seed=SEED,
                                       dropout_offset=OFFSET, return_lse=True, **kw)
    bufs = [torch.full_like(x, math.nan) for x in (q, k, v)]
    grads = flashcute.attention_backward(
        dout, q, k, v, out, lse, dropout_p=p, dropout_seed=SEED, dropout_offset=OFFSET,
        dq=bufs[0], dk=bufs[1], dv=bufs[2], deterministic=deterministic, backend=backend, **kw,
    )
    assert all(g is b for g, b in zip(grads, bufs))
    return grads


def _fwd_backends(headdim: int) -> list[str]:
    """Forward paths with a kernel for this head dim (the smallest compiled one at least as
    large runs it)."""
    return [name for name, (dims, _) in SUPPORT.items() if any(d >= headdim for d in dims)]


def _bwd_backends(headdim: int) -> list:
    """Backward paths for this head dim: Hopper where its backward builds the head dim
    exactly (else the default choice), then the Ampere path."""
    names = ["hopper"] if headdim in HOPPER_BWD_HEAD_DIMS else []
    if not names and any(d >= headdim for d in HOPPER_BWD_HEAD_DIMS):
        names = [None]
    return names + (["ampere"] if any(d >= headdim for d in BWD_HEAD_DIMS) else [])


# ---------------------------------------------------------------------------------------
# Forward and backward over masks, GQA, softcap, head dims and probabilities.

# (seqlen_q, seqlen_k, nheads, nheads_kv, window, causal, softcap, dropout_p)
CASES = [
    (200, 300, 4, 4, NO_WINDOW, False, 0.0, 0.1),
    (300, 200, 6, 2, NO_WINDOW, False, 0.0, 0.5),
    (300, 300, 6, 3, NO_WINDOW, True, 0.0, 0.2),
    (113, 301, 6, 2, NO_WINDOW, True, 0.0, 0.3),   # causal, sq < sk
    (300, 97, 6, 3, NO_WINDOW, True, 0.0, 0.15),   # causal, rows without keys
    (257, 333, 6, 2, (100, 0), False, 30.0, 0.25),  # softcap + window + dropout
    (150, 200, 4, 2, (64, 64), True, 5.0, 0.9),
    (1, 257, 6, 2, NO_WINDOW, False, 0.0, 0.4),    # a decoding step, GQA
]
HEAD_DIMS = (64, 128, 80, 256)  # 80 runs on a larger compiled head dim; 256 on the wide backward


def _case_id(case) -> str:
    seqlen_q, seqlen_k, nheads, nheads_kv, window, causal, softcap, p = case
    return f"{seqlen_q}x{seqlen_k}-h{nheads}_{nheads_kv}-{_mask_id(causal, window, softcap)}-p{p:g}"


def _cases(forward: bool):
    cases = []
    for headdim in HEAD_DIMS:
        backends = _fwd_backends(headdim) if forward else _bwd_backends(headdim)
        for backend in backends:
            dtypes = SUPPORT[backend or "ampere"][1] if forward else BWD_DTYPES
            for index, case in enumerate(CASES):
                dtype = dtypes[index % len(dtypes)]
                cases.append(pytest.param(
                    backend, headdim, dtype, case,
                    id=f"{backend or 'default'}-hd{headdim}-{dtype}-{_case_id(case)}"))
    return cases


def _kw(case) -> dict:
    _, _, _, _, window, causal, softcap, _ = case
    return dict(causal=causal, window=window, softcap=softcap)


@pytest.mark.parametrize("backend, headdim, dtype, case", _cases(forward=True))
def test_forward_dropout(gen, backend, headdim, dtype, case):
    seqlen_q, seqlen_k, nheads, nheads_kv, _, _, _, p = case
    q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype)
    out, lse = run_forward(q, k, v, p, backend=backend, **_kw(case))
    # lse is that of the softmax before dropout: the call without dropout gives it too (to
    # rounding: a schedule may differ with dropout, e.g. query heads packed or not).
    _, plain_lse = flashcute.attention(q, k, v, return_lse=True, backend=backend, **_kw(case))
    torch.testing.assert_close(lse, plain_lse, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("backend, headdim, dtype, case", _cases(forward=False))
def test_backward_dropout(gen, backend, headdim, dtype, case):
    seqlen_q, seqlen_k, nheads, nheads_kv, _, _, _, p = case
    q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype)
    dout = randn_like(gen, q)
    grads = run_backward(q, k, v, dout, p, backend=backend, **_kw(case))
    check_grads(grads, q, k, v, dout, keep_mask(2, nheads, seqlen_q, seqlen_k, p), p, **_kw(case))


@pytest.mark.parametrize("backend", list(SUPPORT))
def test_long_rows_dropout(gen, backend):
    """Many key blocks per row (the unmasked bulk of the Hopper forward, its split last wave)
    and many query tiles."""
    head_dims, dtypes = SUPPORT[backend]
    headdim = 128 if 128 in head_dims else head_dims[-1]
    for seqlen_q, seqlen_k, causal in ((1000, 1500, False), (1500, 1000, True), (128, 4000, False)):
        q, k, v = make_qkv(gen, 1, seqlen_q, seqlen_k, 4, 2, headdim, dtypes[-1])
        run_forward(q, k, v, 0.2, backend=backend, causal=causal)


@pytest.mark.parametrize("backend", _bwd_backends(128) or _bwd_backends(64))
def test_long_rows_backward_dropout(gen, backend):
    headdim = 128 if any(d >= 128 for d in BWD_HEAD_DIMS) else BWD_HEAD_DIMS[-1]
    q, k, v = make_qkv(gen, 1, 1000, 777, 4, 2, headdim, BWD_DTYPES[-1])
    dout = randn_like(gen, q)
    grads = run_backward(q, k, v, dout, 0.2, backend=backend, causal=True)
    check_grads(grads, q, k, v, dout, keep_mask(1, 4, 1000, 777, 0.2), 0.2, causal=True)


# ---------------------------------------------------------------------------------------
# The mask itself: read back exactly, its keep rate, and its dependence on seed and offset.


@pytest.mark.parametrize("backend", list(SUPPORT))
@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_kernel_mask_is_dropout_keep_mask(gen, backend, p):
    """q = 0 gives uniform weights 1/seqlen_k, and v = identity makes out[i, c] the weight of
    key c: the kept weights read back are exactly dropout_keep_mask's, and the kept share is
    1 - p within binomial tolerance."""
    head_dims, dtypes = SUPPORT[backend]
    headdim = 64 if 64 in head_dims else head_dims[0]
    batch, nheads, seqlen_q, seqlen_k = 2, 4, 300, headdim
    dtype = getattr(torch, dtypes[0])
    q = torch.zeros(batch, seqlen_q, nheads, headdim, device="cuda", dtype=dtype)
    eye = torch.eye(seqlen_k, headdim, device="cuda", dtype=dtype)
    k = torch.zeros(batch, seqlen_k, nheads, headdim, device="cuda", dtype=dtype)
    v = eye[None, :, None, :].expand(batch, seqlen_k, nheads, headdim).contiguous()
    out = flashcute.attention(q, k, v, dropout_p=p, dropout_seed=SEED, dropout_offset=OFFSET,
                              backend=backend)
    kept = out.float().transpose(1, 2) * seqlen_k * (1 - p)  # (batch, nheads, sq, sk): 0 or 1
    assert ((kept - kept.round()).abs() < 0.02).all()
    mask = keep_mask(batch, nheads, seqlen_q, seqlen_k, p)
    assert torch.equal(kept.round().bool(), mask)
    share = 1 - flashcute.testing.dropout_threshold(p) / 65536
    n = mask.numel()
    assert abs(mask.float().mean().item() - share) < 5 * math.sqrt(share * (1 - share) / n)


@pytest.mark.parametrize("backend", list(SUPPORT))
def test_seed_and_offset_select_the_mask(gen, backend):
    head_dims, dtypes = SUPPORT[backend]
    q, k, v = make_qkv(gen, 2, 200, 200, 4, 2, head_dims[0], dtypes[0])
    base = flashcute.attention(q, k, v, dropout_p=0.3, dropout_seed=1, dropout_offset=2,
                               backend=backend)
    again = flashcute.attention(q, k, v, dropout_p=0.3, dropout_seed=1, dropout_offset=2,
                                backend=backend)
    assert torch.equal(base.view(torch.int16), again.view(torch.int16))
    state = torch.tensor([1, 2], dtype=torch.int64, device="cuda")
    from_state = flashcute.attention(q, k, v, dropout_p=0.3, dropout_rng_state=state,
                                     backend=backend)
    assert torch.equal(base.view(torch.int16), from_state.view(torch.int16))
    for seed, offset in ((1, 3), (2, 2), (1, 2 + 2**32), (1 + 2**32, 2)):
        other = flashcute.attention(q, k, v, dropout_p=0.3, dropout_seed=seed,
                                    dropout_offset=offset, backend=backend)
        assert (other.float() - base.float()).abs().max().item() > 0.1


# ---------------------------------------------------------------------------------------
# Variable-length batches: each sequence's mask is the corner of the batch's.

# (seqlen_q, seqlen_k) per sequence: empty and single-row sequences, sq != sk both ways.
VARLEN_SEQS = [(1, 1), (0, 7), (17, 300), (257, 129), (130, 0), (63, 64), (1, 65)]


def _varlen_inputs(gen, headdim, dtype, nheads=6, nheads_kv=2):
    dtype = getattr(torch, dtype)
    lengths_q = [sq for sq, _ in VARLEN_SEQS]
    lengths_k = [sk for _, sk in VARLEN_SEQS]

    def offsets(lengths):
        return torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))],
                            dtype=torch.int32, device="cuda")

    def randn(rows, heads):
        return torch.randn(rows, heads, headdim, generator=gen, device="cuda", dtype=dtype)

    q = randn(sum(lengths_q), nheads)
    k, v = randn(sum(lengths_k), nheads_kv), randn(sum(lengths_k), nheads_kv)
    return q, k, v, offsets(lengths_q), offsets(lengths_k), max(lengths_q), max(lengths_k)


def _varlen_check(out, q, k, v, cu_q, cu_k, mask, p, **kw):
    ref = reference.attention_varlen(q, k, v, cu_q, cu_k, dropout_p=p, dropout_mask=mask,
                                     dtype=torch.float64, **kw)
    low = reference.attention_varlen(q, k, v, cu_q, cu_k, dropout_p=p, dropout_mask=mask,
                                     dtype=q.dtype, **kw)
    assert torch.isfinite(out).all()
    err = (out.double() - ref).abs().max().item()
    torch_err = (low.double() - ref).abs().max().item()
    assert err <= 2 * torch_err + OUT_ABS_FLOOR, f"{err:.3g} > 2 * {torch_err:.3g}"


@pytest.mark.parametrize("backend", list(SUPPORT))
@pytest.mark.parametrize("causal, window, softcap", [(False, NO_WINDOW, 0.0), (True, NO_WINDOW, 0.0),
                                                     (False, (24, 0), 30.0)])
def test_varlen_dropout(gen, backend, causal, window, softcap):
    head_dims, dtypes = SUPPORT[backend]
    headdim = 128 if 128 in head_dims else head_dims[-1]
    q, k, v, cu_q, cu_k, max_q, max_k = _varlen_inputs(gen, headdim, dtypes[-1])
    kw = dict(causal=causal, window=window, softcap=softcap)
    p = 0.25
    mask = keep_mask(len(VARLEN_SEQS), q.shape[1], max_q, max_k, p)
    out = poisoned_like(q)
    flashcute.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=p, dropout_seed=SEED,
                               dropout_offset=OFFSET, out=out, backend=backend, **kw)
    _varlen_check(out, q, k, v, cu_q, cu_k, mask, p, **kw)


@pytest.mark.parametrize("backend", _bwd_backends(128) or _bwd_backends(64))
def test_varlen_backward_dropout(gen, backend):
    headdim = 128 if 128 in BWD_HEAD_DIMS else BWD_HEAD_DIMS[-1]
    q, k, v, cu_q, cu_k, max_q, max_k = _varlen_inputs(gen, headdim, BWD_DTYPES[-1])
    p, kw = 0.3, dict(causal=True)
    mask = keep_mask(len(VARLEN_SEQS), q.shape[1], max_q, max_k, p)
    state = torch.tensor([SEED, OFFSET], dtype=torch.int64, device="cuda")
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    out = flashcute.attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, dropout_p=p,
                                     dropout_rng_state=state, backend=backend, **kw)
    dout = randn_like(gen, q)
    out.backward(dout)
    _varlen_check(out.detach(), q, k, v, cu_q, cu_k, mask, p, **kw)
    exact_leaves = [x.detach().double().requires_grad_(True) for x in (q, k, v)]
    ref = reference.attention_varlen(*exact_leaves, cu_q, cu_k, dropout_p=p, dropout_mask=mask, **kw)
    ref.backward(dout.double())
    low_leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    low = reference.attention_varlen(*low_leaves, cu_q, cu_k, dropout_p=p, dropout_mask=mask,
                                     dtype=q.dtype, **kw)
    low.backward(dout.to(low.dtype))
    scale = max(x.grad.abs().max().item() for x in exact_leaves)
    for got, exact, lo in zip(leaves, exact_leaves, low_leaves):
        err = (got.grad.double() - exact.grad).abs().max().item()
        torch_err = (lo.grad.double() - exact.grad).abs().max().item()
        assert err <= 2 * torch_err + ABS_FLOOR + REL_FLOOR * scale


# ---------------------------------------------------------------------------------------
# Autograd, deterministic backward, torch's generator, CUDA graphs, torch.compile.


def _autograd(q, k, v, dout, **kw):
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    out = flashcute.attention(*leaves, **kw)
    assert out.requires_grad
    out.backward(dout)
    return out.detach(), [x.grad for x in leaves]


FWD_BACKENDS = [None] + (["ampere"] if "hopper" in SUPPORT else [])


@pytest.mark.parametrize("fwd_backend", FWD_BACKENDS, ids=lambda b: f"fwd-{b or 'default'}")
@pytest.mark.parametrize("headdim", [64, 128])
def test_autograd_dropout(gen, fwd_backend, headdim):
    """The eager autograd route with a drawn rng state: the forward's output and the
    gradients both match the reference under the mask of that state."""
    if not any(d >= headdim for d in BWD_HEAD_DIMS):
        pytest.skip(f"head dim {headdim} has no backward in this build")
    q, k, v = make_qkv(gen, 2, 300, 97, 6, 2, headdim, BWD_DTYPES[0])
    dout = randn_like(gen, q)
    kw = dict(causal=True, window=(17, 0))
    state = flashcute.dropout_rng_state(q.device)
    out, grads = _autograd(q, k, v, dout, dropout_p=0.2, dropout_rng_state=state,
                           backend=fwd_backend, **kw)
    mask = keep_mask(2, 6, 300, 97, 0.2, *state_values(state))
    check_forward(out, None, q, k, v, mask, 0.2, **kw)
    check_grads(grads, q, k, v, dout, mask, 0.2, **kw)


@pytest.mark.parametrize("headdim", [64, 128])
def test_deterministic_backward_dropout(gen, headdim):
    """Bitwise equal gradients across runs, by name and through autograd, within the bound."""
    if not any(d >= headdim for d in BWD_HEAD_DIMS):
        pytest.skip(f"head dim {headdim} has no Ampere-path backward in this build")
    q, k, v = make_qkv(gen, 2, 777, 1000, 4, 2, headdim, BWD_DTYPES[-1])
    dout = randn_like(gen, q)
    kw = dict(causal=False, softcap=30.0)
    runs = [run_backward(q, k, v, dout, 0.1, backend=b, deterministic=True, **kw)
            for b in ("ampere", "ampere", None)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    check_grads(runs[0], q, k, v, dout, keep_mask(2, 4, 777, 1000, 0.1), 0.1, **kw)
    _, grads = _autograd(q, k, v, dout, dropout_p=0.1, dropout_seed=SEED, dropout_offset=OFFSET,
                         deterministic=True, **kw)
    for a, b in zip(runs[0], grads):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_torch_generator_draws_per_call(gen):
    """Calls without a seed differ from each other, torch.manual_seed reproduces them, and
    each one's mask is that of the state flashcute.dropout_rng_state draws at that point."""
    head_dims, dtypes = SUPPORT[next(iter(SUPPORT))]
    q, k, v = make_qkv(gen, 2, 200, 250, 4, 2, head_dims[0], dtypes[0])
    torch.manual_seed(2024)
    first = flashcute.attention(q, k, v, dropout_p=0.3)
    second = flashcute.attention(q, k, v, dropout_p=0.3)
    assert (first.float() - second.float()).abs().max().item() > 0.1
    torch.manual_seed(2024)
    assert torch.equal(flashcute.attention(q, k, v, dropout_p=0.3).view(torch.int16),
                       first.view(torch.int16))
    torch.manual_seed(2024)
    state = flashcute.dropout_rng_state(q.device)
    assert all(0 <= x < 2**63 for x in state.tolist())
    check_forward(first, None, q, k, v, keep_mask(2, 4, 200, 250, 0.3, *state_values(state)), 0.3)
    # The autograd route draws the same way.
    torch.manual_seed(2024)
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    assert torch.equal(flashcute.attention(*leaves, dropout_p=0.3).detach().view(torch.int16),
                       first.view(torch.int16))


def test_cuda_graph_replays_draw_new_masks(gen):
    """A captured call draws its state on the device: each replay gives another output,
    each one that of the mask of the state drawn for it."""
    head_dims, dtypes = SUPPORT[next(iter(SUPPORT))]
    q, k, v = make_qkv(gen, 2, 200, 250, 4, 2, head_dims[0], dtypes[0])

    def body():
        state = flashcute.dropout_rng_state(q.device)
        return state, flashcute.attention(q, k, v, dropout_p=0.25, dropout_rng_state=state), \
            flashcute.attention(q, k, v, dropout_p=0.25)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()  # warm-up: plans and workspaces
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        state, out, implicit = body()
    outputs = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        outputs.append((state.clone(), out.clone(), implicit.clone()))
    (s1, o1, i1), (s2, o2, i2) = outputs
    assert s1.tolist() != s2.tolist()
    assert (o1.float() - o2.float()).abs().max().item() > 0.1
    assert (i1.float() - i2.float()).abs().max().item() > 0.1
    for s, o in ((s1, o1), (s2, o2)):
        check_forward(o, None, q, k, v, keep_mask(2, 4, 200, 250, 0.25, *state_values(s)), 0.25)


def test_torch_compile_fullgraph_dropout(gen):
    """A compiled training step: with a given rng state, output and gradients within the
    bound of the reference under its mask (the backward op saw the forward's mask); drawing
    its own state, the forward op follows torch.manual_seed as the eager route does (the
    same output bit for bit) and two steps differ."""
    import torch._inductor.config  # noqa: F401  (the fallback_random patch below)

    headdim = 128 if 128 in BWD_HEAD_DIMS else BWD_HEAD_DIMS[-1]
    dtype = "bfloat16" if "bfloat16" in BWD_DTYPES else BWD_DTYPES[0]
    torch._dynamo.reset()
    q, k, v = make_qkv(gen, 2, 300, 333, 8, 2, headdim, dtype)
    dout = randn_like(gen, q)
    kw = dict(causal=True, window=(64, 0), softcap=30.0)

    @torch.compile(fullgraph=True)
    def step_with_state(q, k, v, state):
        out = flashcute.attention(q, k, v, dropout_p=0.15, dropout_rng_state=state, **kw)
        return out, (out.float() * dout.float()).sum()

    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    state = flashcute.dropout_rng_state(q.device)
    out, loss = step_with_state(*leaves, state)
    loss.backward()
    mask = keep_mask(2, 8, 300, 333, 0.15, *state_values(state))
    check_forward(out.detach(), None, q, k, v, mask, 0.15, **kw)
    check_grads([x.grad for x in leaves], q, k, v, dout, mask, 0.15, **kw)

    @torch.compile(fullgraph=True)
    def step(q, k, v):
        out = flashcute.attention(q, k, v, dropout_p=0.15, **kw)
        return out, (out.float() * dout.float()).sum()

    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    torch.manual_seed(7)
    # The draw is a graph node (randint); inductor's own generator would give other values
    # than eager's, so it falls back to torch's here to compare bit for bit.
    with torch._inductor.config.patch(fallback_random=True):
        compiled_out, loss = step(*leaves)
    loss.backward()
    torch.manual_seed(7)
    mask = keep_mask(2, 8, 300, 333, 0.15, *state_values(flashcute.dropout_rng_state(q.device)))
    check_grads([x.grad for x in leaves], q, k, v, dout, mask, 0.15, **kw)
    torch.manual_seed(7)
    eager_out, _ = _autograd(q, k, v, dout, dropout_p=0.15, **kw)
    assert torch.equal(compiled_out.detach().view(torch.int16), eager_out.view(torch.int16))
    with torch._inductor.config.patch(fallback_random=True):
        other, _ = step(*leaves)
    assert (other.detach().float() - compiled_out.detach().float()).abs().max().item() > 0.1

    # Two equal calls in one graph: each draws its own state, no compiler merges them.
    @torch.compile(fullgraph=True)
    def twice(q, k, v):
        return (flashcute.attention(q, k, v, dropout_p=0.15, **kw),
                flashcute.attention(q, k, v, dropout_p=0.15, **kw))

    first, second = twice(q, k, v)
    assert (first.float() - second.float()).abs().max().item() > 0.1


def test_flash_attn_func_dropout(gen):
    head_dims, dtypes = SUPPORT[next(iter(SUPPORT))]
    q, k, v = make_qkv(gen, 2, 150, 200, 4, 2, head_dims[-1], dtypes[0])
    torch.manual_seed(3)
    out = flashcute.flash_attn_func(q, k, v, 0.2, causal=True)
    torch.manual_seed(3)
    want = flashcute.attention(q, k, v, dropout_p=0.2, causal=True)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))


# ---------------------------------------------------------------------------------------
# Bad arguments on CUDA inputs.


def test_bad_rng_state_device_is_named(gen):
    q, k, v = make_qkv(gen, 2, 16, 16, 4, 2, 64, BWD_DTYPES[0] if BWD_DTYPES else "float16")
    cpu_state = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^dropout_rng_state: expected a CUDA tensor"):
        flashcute.attention(q, k, v, dropout_p=0.1, dropout_rng_state=cpu_state)
    out, lse = flashcute.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"^dropout_rng_state: expected a CUDA tensor"):
        flashcute.attention_backward(torch.ones_like(q), q, k, v, out, lse, dropout_p=0.1,
                                     dropout_rng_state=cpu_state)
    with pytest.raises(ValueError, match=r"^dropout_seed: "):
        flashcute.attention_backward(torch.ones_like(q), q, k, v, out, lse, dropout_p=0.1)


@pytest.mark.skipif(not SUPPORT.get("hopper", ([], []))[0] or torch.cuda.get_device_capability() != (9, 0),
                    reason="the Hopper path's forward splits its last wave")
def test_workspace_query_with_dropout_plans_unpacked_heads():
    """Dropout turns off packed query heads: the workspace query with dropout plans as one with
    ALiBi (which turns them off too), and for GQA calls that pack, unlike one without either."""
    from flashcute._build_info import load_extension

    ext = load_extension()
    head_dims, dtypes = SUPPORT["hopper"]
    headdim = 128 if 128 in head_dims else head_dims[-1]
    differs = False
    for batch, seqlen_q, seqlen_k, nheads, nheads_kv in [
        (4, 64, 8192, 32, 4), (2, 128, 4096, 16, 2), (1, 1000, 3000, 8, 1), (3, 2048, 2048, 16, 16),
    ]:
        args = (batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtypes[0], False, ext.BACKEND_HOPPER, -1)
        plain = ext.forward_workspace_size(*args)
        with_dropout = ext.forward_workspace_size(*args, dropout=True)
        assert with_dropout == ext.forward_workspace_size(*args, alibi=True)
        differs |= with_dropout != plain
    assert differs, "no shape packs query heads: the check above cannot tell the plans apart"
