"""ALiBi on a GPU, forward and backward, against flashcute.reference in float64.

The checks are test_gpu_masks.py's (twice PyTorch's own error at the input precision, lse to
a fixed tolerance, exact zeros for rows and keys outside every visible pair, NaN-filled output
buffers), with the bias -slope·|i + seqlen_k - seqlen_q - j| added after the softcap and before
the mask. Slopes are (nheads,) or (batch, nheads) float32: the geometric ones of the ALiBi paper
(2^(-8(h+1)/nheads), steep to flat) or random ones per batch row, so that the slope follows both
the head and the batch.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402

from test_gpu_backward import BWD_DTYPES, BWD_HEAD_DIMS, randn_like  # noqa: E402
from test_gpu_forward import SUPPORT, gen, make_qkv  # noqa: E402,F401
from test_gpu_masks import (  # noqa: E402
    MAIN_HEAD_DIMS, NO_WINDOW, OTHER_HEAD_DIMS, _bwd_backends, _fwd_backends, _mask_id,
    _saturated_share, autograd_grads, check_forward, check_grads, run_backward, run_forward,
)

pytestmark = pytest.mark.gpu


def geometric_slopes(nheads: int) -> torch.Tensor:
    """The ALiBi paper's slopes, float32 (nheads,) on the GPU."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / nheads) for h in range(nheads)],
                        dtype=torch.float32, device="cuda")


def make_slopes(gen, batch: int, nheads: int, per_batch: bool) -> torch.Tensor:
    """(nheads,) geometric slopes, or (batch, nheads) random ones in [0.01, 0.5]."""
    if not per_batch:
        return geometric_slopes(nheads)
    u = torch.rand((batch, nheads), generator=gen, device="cuda", dtype=torch.float32)
    return 0.01 + 0.49 * u


def _inputs(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype, boost=1.0):
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype)
    return q * boost, k, v  # powers of two: exact in both dtypes


# ---------------------------------------------------------------------------------------
# ALiBi alone and with causal, windows, softcap, GQA, seqlen_q != seqlen_k both ways.

# (seqlen_q, seqlen_k, nheads, nheads_kv, window, causal, softcap, q multiplier,
#  softmax_scale, per-batch slopes)
CASES = [
    (200, 300, 4, 4, NO_WINDOW, False, 0.0, 1.0, None, False),
    (300, 200, 6, 2, NO_WINDOW, False, 0.0, 1.0, None, True),
    (300, 300, 6, 3, NO_WINDOW, True, 0.0, 1.0, None, False),
    (300, 97, 6, 3, NO_WINDOW, True, 0.0, 1.0, None, True),  # rows without keys
    (113, 301, 6, 2, (17, 17), False, 0.0, 1.0, None, True),
    (300, 97, 6, 3, (256, -1), True, 0.0, 1.0, None, False),
    (113, 301, 6, 2, (100, 3), False, 0.0, 1.0, None, False),  # keys no row sees
    (200, 300, 4, 4, NO_WINDOW, False, 5.0, 8.0, None, False),
    (257, 333, 6, 2, (100, 0), False, 30.0, 64.0, None, True),
    (150, 200, 4, 2, (64, 64), True, 5.0, 1.0, 0.5, True),
    (1, 257, 6, 2, NO_WINDOW, False, 0.0, 1.0, None, False),  # a decoding step, GQA
    (1, 257, 6, 3, (100, 0), True, 5.0, 8.0, None, True),
]


def _case_id(case) -> str:
    seqlen_q, seqlen_k, nheads, nheads_kv, window, causal, softcap, boost, scale, per_batch = case
    return (f"{seqlen_q}x{seqlen_k}-h{nheads}_{nheads_kv}-{_mask_id(causal, window, softcap)}"
            f"-q{boost:g}" + (f"-scale{scale:g}" if scale else "")
            + ("-slopes_bh" if per_batch else "-slopes_h"))


def _cases(table, head_dims, forward: bool):
    cases = []
    for headdim in head_dims:
        backends = _fwd_backends(headdim) if forward else _bwd_backends(headdim)
        for backend in backends:
            dtypes = SUPPORT[backend][1] if forward else BWD_DTYPES
            for index, case in enumerate(table):
                dtype = dtypes[index % len(dtypes)]
                cases.append(pytest.param(backend, headdim, dtype, case,
                                          id=f"{backend}-hd{headdim}-{dtype}-{_case_id(case)}"))
    return cases


def _forward(gen, backend, headdim, dtype, case, batch=2):
    seqlen_q, seqlen_k, nheads, nheads_kv, window, causal, softcap, boost, scale, per_batch = case
    q, k, v = _inputs(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype, boost)
    if boost > 1:
        assert _saturated_share(q, k, softcap, scale) > 0.1, "inputs do not saturate tanh"
    slopes = make_slopes(gen, batch, nheads, per_batch)
    return run_forward(q, k, v, backend=backend, causal=causal, window=window, softcap=softcap,
                       softmax_scale=scale, alibi_slopes=slopes)


def _backward(gen, backend, headdim, dtype, case, batch=2, deterministic=False):
    seqlen_q, seqlen_k, nheads, nheads_kv, window, causal, softcap, boost, scale, per_batch = case
    q, k, v = _inputs(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype, boost)
    slopes = make_slopes(gen, batch, nheads, per_batch)
    dout = randn_like(gen, q)
    mask = dict(causal=causal, window=window, softcap=softcap, softmax_scale=scale,
                alibi_slopes=slopes)
    grads = run_backward(q, k, v, dout, backend=backend, deterministic=deterministic, **mask)
    check_grads(grads, q, k, v, dout, **mask)
    return grads


@pytest.mark.parametrize("backend, headdim, dtype, case", _cases(CASES, MAIN_HEAD_DIMS, True))
def test_forward_alibi(gen, backend, headdim, dtype, case):
    _forward(gen, backend, headdim, dtype, case)


@pytest.mark.parametrize("backend, headdim, dtype, case", _cases(CASES, MAIN_HEAD_DIMS, False))
def test_backward_alibi(gen, backend, headdim, dtype, case):
    _backward(gen, backend, headdim, dtype, case)


# ---------------------------------------------------------------------------------------
# Long rows: many key blocks, so the unmasked bulk (on the Hopper path the blocks that keep
# the row max and those that compute S again) takes the bias too; few query tiles with long
# keys (the Hopper forward splits their last wave); a GQA group whose blocks a split
# backward tile shares.

LONG_CASES = [
    (1000, 1000, 6, 2, NO_WINDOW, False, 0.0, 1.0, None, False),
    (1000, 1000, 6, 2, NO_WINDOW, True, 0.0, 1.0, None, True),
    (1000, 1500, 6, 2, (700, 500), False, 0.0, 1.0, None, False),
    (1500, 1000, 6, 3, NO_WINDOW, True, 30.0, 1.0, None, True),
    (128, 4000, 8, 2, NO_WINDOW, False, 0.0, 1.0, None, False),
]


@pytest.mark.parametrize("backend, headdim, dtype, case", _cases(LONG_CASES, MAIN_HEAD_DIMS, True))
def test_forward_alibi_long(gen, backend, headdim, dtype, case):
    _forward(gen, backend, headdim, dtype, case, batch=1)


@pytest.mark.parametrize("backend, headdim, dtype, case",
                         _cases(LONG_CASES, MAIN_HEAD_DIMS, False))
def test_backward_alibi_long(gen, backend, headdim, dtype, case):
    _backward(gen, backend, headdim, dtype, case, batch=1)


# The other compiled head dims (hd 256's Hopper backward splits the head dim).
SMALL_CASES = [
    (113, 301, 6, 3, (17, 17), False, 0.0, 1.0, None, True),
    (300, 97, 6, 3, NO_WINDOW, True, 30.0, 1.0, None, False),
]


@pytest.mark.parametrize("backend, headdim, dtype, case", _cases(SMALL_CASES, OTHER_HEAD_DIMS, True))
def test_forward_alibi_other_head_dims(gen, backend, headdim, dtype, case):
    _forward(gen, backend, headdim, dtype, case)


@pytest.mark.parametrize("backend, headdim, dtype, case",
                         _cases(SMALL_CASES, OTHER_HEAD_DIMS, False))
def test_backward_alibi_other_head_dims(gen, backend, headdim, dtype, case):
    _backward(gen, backend, headdim, dtype, case)


# ---------------------------------------------------------------------------------------
# The slopes reach the kernel once: zero slopes change nothing, real ones change the result,
# and (batch, nheads) slopes broadcast from one row equal (nheads,) slopes.


@pytest.mark.parametrize("backend", list(SUPPORT))
@pytest.mark.parametrize("causal", [False, True])
def test_zero_slopes_are_no_bias(gen, backend, causal):
    head_dims, dtypes = SUPPORT[backend]
    headdim = 128 if 128 in head_dims else head_dims[-1]
    # No GQA: the Hopper forward would pack the query heads of a group without ALiBi only,
    # and its row groups decide between two exact but different softmax updates.
    q, k, v = make_qkv(gen, 2, 300, 333, 6, 6, headdim, dtypes[0])
    plain, plain_lse = flashcute.attention(q, k, v, causal=causal, return_lse=True,
                                           backend=backend)
    zero = torch.zeros(6, dtype=torch.float32, device="cuda")
    out, lse = flashcute.attention(q, k, v, causal=causal, alibi_slopes=zero, return_lse=True,
                                   backend=backend)
    # The bias adds slope·distance = +0.0 to every raw score: the same arithmetic after it.
    assert torch.equal(out.view(torch.int16), plain.view(torch.int16))
    assert torch.equal(lse, plain_lse)
    biased = flashcute.attention(q, k, v, causal=causal, alibi_slopes=geometric_slopes(6),
                                 backend=backend)
    assert (biased.float() - plain.float()).abs().max().item() > 0.1


@pytest.mark.parametrize("backend", list(SUPPORT))
def test_broadcast_slopes_equal_per_head_slopes(gen, backend):
    """(batch, nheads) slopes with a batch stride of 0 (expand) and a contiguous copy give
    the (nheads,) slopes' output bit for bit; slopes that differ per batch row do not."""
    head_dims, dtypes = SUPPORT[backend]
    headdim = 64 if 64 in head_dims else head_dims[0]
    q, k, v = make_qkv(gen, 3, 150, 200, 4, 2, headdim, dtypes[-1])
    slopes = geometric_slopes(4)
    want = flashcute.attention(q, k, v, alibi_slopes=slopes, backend=backend)
    for per_batch in (slopes.expand(3, 4), slopes.expand(3, 4).contiguous()):
        got = flashcute.attention(q, k, v, alibi_slopes=per_batch, backend=backend)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    rows = torch.stack([slopes, slopes / 4, slopes * 2])
    out = flashcute.attention(q, k, v, alibi_slopes=rows, backend=backend)
    assert torch.equal(out[0].view(torch.int16), want[0].view(torch.int16))
    assert (out[1:].float() - want[1:].float()).abs().max().item() > 0.05
    check_forward(out, None, q, k, v, causal=False, window=NO_WINDOW, softcap=0.0,
                  alibi_slopes=rows)


def test_flash_attn_func_alibi(gen):
    """FlashAttention's alibi_slopes through flash_attn_func: flashcute.attention's result."""
    head_dims, dtypes = SUPPORT[next(iter(SUPPORT))]
    q, k, v = make_qkv(gen, 2, 150, 200, 4, 2, head_dims[-1], dtypes[0])
    slopes = make_slopes(gen, 2, 4, per_batch=True)
    out, lse, _ = flashcute.flash_attn_func(q, k, v, causal=True, window_size=(50, 0),
                                             alibi_slopes=slopes, return_attn_probs=True)
    want, want_lse = flashcute.attention(q, k, v, causal=True, window=(50, 0),
                                         alibi_slopes=slopes, return_lse=True)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert torch.equal(lse, want_lse)
    check_forward(out, lse, q, k, v, causal=True, window=(50, 0), softcap=0.0,
                  alibi_slopes=slopes)


@pytest.mark.parametrize("backend", list(SUPPORT))
def test_no_keys_with_alibi(gen, backend):
    head_dims, dtypes = SUPPORT[backend]
    q, k, v = make_qkv(gen, 2, 7, 0, 4, 2, head_dims[0], dtypes[0])
    out = torch.full_like(q, math.nan)
    result, lse = flashcute.attention(q, k, v, alibi_slopes=geometric_slopes(4), return_lse=True,
                                      out=out, backend=backend)
    assert result is out and (result == 0).all() and torch.isneginf(lse).all()


# ---------------------------------------------------------------------------------------
# Routes: autograd, deterministic, torch.compile.

FWD_BACKENDS = [None] + (["ampere"] if "hopper" in SUPPORT else [])
# (seqlen_q, seqlen_k, window, causal, softcap)
AUTOGRAD_CASES = [(300, 97, (17, 0), True, 0.0), (113, 301, NO_WINDOW, False, 30.0),
                  (333, 333, (-1, 64), False, 0.0)]


@pytest.mark.parametrize("fwd_backend", FWD_BACKENDS, ids=lambda b: f"fwd-{b or 'default'}")
@pytest.mark.parametrize("headdim", MAIN_HEAD_DIMS)
@pytest.mark.parametrize("seqlen_q, seqlen_k, window, causal, softcap", AUTOGRAD_CASES,
                         ids=[f"{c[0]}x{c[1]}-{_mask_id(c[3], c[2], c[4])}" for c in AUTOGRAD_CASES])
def test_autograd_alibi(gen, fwd_backend, headdim, seqlen_q, seqlen_k, window, causal, softcap):
    if headdim not in BWD_HEAD_DIMS:
        pytest.skip(f"head dim {headdim} has no backward in this build")
    q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, 6, 2, headdim, BWD_DTYPES[0])
    slopes = make_slopes(gen, 2, 6, per_batch=True)
    dout = randn_like(gen, q)
    mask = dict(causal=causal, window=window, softcap=softcap, alibi_slopes=slopes)
    out, grads = autograd_grads(q, k, v, dout, backend=fwd_backend, **mask)
    check_forward(out, None, q, k, v, **mask)
    check_grads(grads, q, k, v, dout, **mask)


# (seqlen_q, seqlen_k, window, causal, softcap, per-batch slopes)
DETERMINISTIC_CASES = [(777, 1000, NO_WINDOW, False, 30.0, True),
                       (1000, 777, (256, 0), True, 0.0, False)]


@pytest.mark.parametrize("headdim", MAIN_HEAD_DIMS)
@pytest.mark.parametrize("seqlen_q, seqlen_k, window, causal, softcap, per_batch",
                         DETERMINISTIC_CASES,
                         ids=[f"{c[0]}x{c[1]}-{_mask_id(c[3], c[2], c[4])}"
                              for c in DETERMINISTIC_CASES])
def test_deterministic_backward_alibi(gen, headdim, seqlen_q, seqlen_k, window, causal, softcap,
                                      per_batch):
    """Bitwise equal gradients across runs (the Ampere path's dQ pass), by name, by
    backend=None and through autograd, and within the bound of the float64 gradients."""
    if headdim not in BWD_HEAD_DIMS:
        pytest.skip(f"head dim {headdim} has no Ampere-path backward in this build")
    q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, 4, 2, headdim, BWD_DTYPES[-1])
    slopes = make_slopes(gen, 2, 4, per_batch)
    dout = randn_like(gen, q)
    mask = dict(causal=causal, window=window, softcap=softcap, alibi_slopes=slopes)
    runs = [run_backward(q, k, v, dout, backend=backend, deterministic=True, **mask)
            for backend in ("ampere", "ampere", None)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    check_grads(runs[0], q, k, v, dout, **mask)
    _, grads = autograd_grads(q, k, v, dout, backend=None, deterministic=True, **mask)
    for a, b in zip(runs[0], grads):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_torch_compile_fullgraph_alibi(gen):
    """A compiled training step (the custom ops, slopes as a graph input) gives the eager
    route's output bit for bit, dK and dV bit for bit, and gradients within the bound."""
    headdim = 128 if 128 in BWD_HEAD_DIMS else BWD_HEAD_DIMS[-1]
    dtype = "bfloat16" if "bfloat16" in BWD_DTYPES else BWD_DTYPES[0]
    torch._dynamo.reset()
    q, k, v = make_qkv(gen, 2, 300, 333, 8, 2, headdim, dtype)
    slopes = make_slopes(gen, 2, 8, per_batch=True)
    mask = dict(causal=False, window=(64, 32), softcap=30.0)
    dout = randn_like(gen, q)

    @torch.compile(fullgraph=True)
    def step(q, k, v, slopes):
        out = flashcute.attention(q, k, v, alibi_slopes=slopes, **mask)
        return out, (out.float() * dout.float()).sum()

    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    compiled_out, loss = step(*leaves, slopes)
    loss.backward()
    compiled = [x.grad for x in leaves]
    eager_out, eager = autograd_grads(q, k, v, dout, backend=None, alibi_slopes=slopes, **mask)

    assert torch.equal(compiled_out.detach().view(torch.int16), eager_out.view(torch.int16))
    check_forward(compiled_out.detach(), None, q, k, v, alibi_slopes=slopes, **mask)
    check_grads(compiled, q, k, v, dout, alibi_slopes=slopes, **mask)
    for a, b in zip(compiled[1:], eager[1:]):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    # New slope values with the same layout reuse the graph and reach the kernel.
    other, _ = step(*leaves, slopes * 0.5)
    assert (other.detach().float() - compiled_out.detach().float()).abs().max().item() > 0.01


def test_torch_compile_out_alibi(gen):
    """The mutating custom op (out=) under torch.compile, slopes included."""
    backend = "hopper" if "hopper" in SUPPORT else "ampere"
    head_dims, dtypes = SUPPORT[backend]
    headdim = 128 if 128 in head_dims else head_dims[-1]
    torch._dynamo.reset()
    q, k, v = make_qkv(gen, 2, 200, 300, 4, 2, headdim, dtypes[0])
    slopes = geometric_slopes(4)

    @torch.compile(fullgraph=True)
    def fn(q, k, v, slopes, out):
        flashcute.attention(q, k, v, causal=True, alibi_slopes=slopes, out=out, backend=backend)
        return out

    out = fn(q, k, v, slopes, torch.full_like(q, math.nan))
    check_forward(out, None, q, k, v, causal=True, window=NO_WINDOW, softcap=0.0,
                  alibi_slopes=slopes)


# ---------------------------------------------------------------------------------------
# Bad slopes on CUDA inputs: named on every route, before any kernel runs.

BAD_SLOPES = [
    ("cpu", lambda: torch.ones(4), ValueError, r"^alibi_slopes: expected a CUDA tensor"),
    ("float16", lambda: torch.ones(4, device="cuda", dtype=torch.float16), TypeError,
     r"^alibi_slopes: expected float32"),
    ("nheads+1", lambda: torch.ones(5, device="cuda"), ValueError, r"^alibi_slopes: expected shape"),
    ("batch+1", lambda: torch.ones(3, 4, device="cuda"), ValueError,
     r"^alibi_slopes: expected shape"),
    ("3d", lambda: torch.ones(2, 4, 1, device="cuda"), ValueError, r"^alibi_slopes: expected shape"),
    ("strided", lambda: torch.ones(8, device="cuda")[::2], ValueError,
     r"^alibi_slopes: expected unit stride"),
    ("list", lambda: [0.5] * 4, TypeError, r"^alibi_slopes: "),
]


@pytest.mark.parametrize("make, error, match", [c[1:] for c in BAD_SLOPES],
                         ids=[c[0] for c in BAD_SLOPES])
def test_bad_slopes_are_named(gen, make, error, match):
    q, k, v = make_qkv(gen, 2, 16, 16, 4, 2, 64, BWD_DTYPES[0] if BWD_DTYPES else "float16")
    slopes = make()
    with pytest.raises(error, match=match):
        flashcute.attention(q, k, v, alibi_slopes=slopes)
    with pytest.raises(error, match=match):
        flashcute.attention(*(x.detach().requires_grad_(True) for x in (q, k, v)),
                            alibi_slopes=slopes)
    with pytest.raises(error, match=match):
        flashcute.attention(q, k, v, alibi_slopes=slopes, out=torch.empty_like(q))
    out, lse = flashcute.attention(q, k, v, return_lse=True)
    with pytest.raises(error, match=match):
        flashcute.attention_backward(torch.ones_like(q), q, k, v, out, lse, alibi_slopes=slopes)
    with pytest.raises(error, match=match):
        flashcute.flash_attn_func(q, k, v, alibi_slopes=slopes)
