"""Variable-length batches on a GPU, forward and backward, on every path this build runs.

Each sequence of a packed batch is checked as the fixed-length call it stands for, by the
rules of test_gpu_masks.py (out, lse, dq, dk, dv against float64 within twice PyTorch's own
error; rows with no visible key exactly 0 with lse -inf; unseen keys exactly 0 gradients),
and the whole packed output against ``flashcute.reference.attention_varlen``. Every output
buffer starts NaN-filled and every row belongs to a sequence, so an unwritten row shows.
With ``seqused_k``, the key and value rows past each sequence's used keys hold NaN: the
results must not see them, and their dk, dv must be exactly 0. ALiBi's distance takes each
sequence's own lengths (its used keys with ``seqused_k``), with (nheads,) slopes or a row of
(batch, nheads) slopes per sequence.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
from flashcute import reference  # noqa: E402

from test_gpu_forward import OUT_ABS_FLOOR, SUPPORT, check_claimed_order, gen  # noqa: E402,F401
from test_gpu_masks import _bwd_backends, _fwd_backends, check_forward, check_grads  # noqa: E402

pytestmark = pytest.mark.gpu

# (seqlen_q, seqlen_k) per sequence: empty and single-row sequences, odd lengths, sq != sk
# both ways, a sequence without keys, lengths across tile boundaries.
MIXED = [(1, 1), (0, 7), (17, 300), (257, 129), (130, 0), (63, 64), (200, 200), (1, 65),
         (129, 1)]
NO_WINDOW = (-1, -1)
W = 24
WINDOWS = [NO_WINDOW, (0, 0), (W, 0), (W, W), (W, -1)]


def _head_dim() -> int:
    """The head dim the tests run: 128 where built, else the first built one."""
    dims = sorted({d for head_dims, _ in SUPPORT.values() for d in head_dims})
    return 128 if 128 in dims else (dims[0] if dims else 128)


HEADDIM = _head_dim()
# The Hopper path's forward head dims here (each tile shape claims tiles its own way).
HOPPER_DIMS = sorted(SUPPORT["hopper"][0]) if "hopper" in SUPPORT else []
DTYPE = "bfloat16" if all("bfloat16" in dtypes for _, dtypes in SUPPORT.values()) else "float16"


def _offsets(lengths) -> torch.Tensor:
    values = [0]
    for n in lengths:
        values.append(values[-1] + n)
    return torch.tensor(values, dtype=torch.int32, device="cuda")


class Batch:
    """A packed batch: q, k, v, offsets, optional seqused_k (keys past it NaN)."""

    def __init__(self, gen, seqs, *, nheads=6, nheads_kv=2, headdim=HEADDIM, dtype=DTYPE,
                 seqused=False):
        dtype = getattr(torch, dtype)
        self.seqs = list(seqs)
        lengths_q = [sq for sq, _ in seqs]
        lengths_k = [sk for _, sk in seqs]
        self.cu_q, self.cu_k = _offsets(lengths_q), _offsets(lengths_k)
        self.max_q, self.max_k = max(lengths_q), max(lengths_k)

        def randn(rows, heads):
            return torch.randn(rows, heads, headdim, generator=gen, device="cuda", dtype=dtype)

        self.q = randn(sum(lengths_q), nheads)
        self.k, self.v = randn(sum(lengths_k), nheads_kv), randn(sum(lengths_k), nheads_kv)
        self.used = None
        self.used_lengths = lengths_k
        if seqused:
            # Every third sequence uses all its keys, the others a part (none for some).
            self.used_lengths = [sk if i % 3 == 0 else sk * (i % 3) // 4 for i, sk in enumerate(lengths_k)]
            self.used = torch.tensor(self.used_lengths, dtype=torch.int32, device="cuda")
            for start, (used, sk) in zip(self.cu_k.tolist(), zip(self.used_lengths, lengths_k)):
                self.k[start + used:start + sk] = math.nan
                self.v[start + used:start + sk] = math.nan

    def args(self):
        return (self.q, self.k, self.v, self.cu_q, self.cu_k, self.max_q, self.max_k)

    def spans(self):
        """Per sequence: (query rows, used key rows, unused key rows) as slices."""
        for b, (sq, sk) in enumerate(self.seqs):
            q0, k0 = int(self.cu_q[b]), int(self.cu_k[b])
            used = self.used_lengths[b]
            yield (slice(q0, q0 + sq), slice(k0, k0 + used), slice(k0 + used, k0 + sk))

    def slopes_of(self, slopes, b):
        """Sequence b's ALiBi slopes, (nheads,), or None."""
        if slopes is None or slopes.dim() == 1:
            return slopes
        return slopes[b]

    def clean_kv(self):
        """k, v with the unused rows zeroed (for references that must not see NaN)."""
        k, v = self.k.clone(), self.v.clone()
        for _, _, unused in self.spans():
            k[unused] = 0
            v[unused] = 0
        return k, v


def check_varlen_forward(batch: Batch, out, lse, *, causal, window, softcap, alibi_slopes=None):
    assert out.shape == batch.q.shape and lse.shape == (batch.q.shape[1], batch.q.shape[0])
    assert torch.isfinite(out).all(), "output has non-finite elements (unwritten or NaN)"
    assert not torch.isnan(lse).any(), "lse has NaN (unwritten)"
    mask = dict(causal=causal, window=window, softcap=softcap)
    for b, (rows, keys, _) in enumerate(batch.spans()):
        check_forward(out[None, rows], lse[None, :, rows], batch.q[None, rows],
                      batch.k[None, keys], batch.v[None, keys],
                      alibi_slopes=batch.slopes_of(alibi_slopes, b), **mask)
    # The whole packed result against the packed reference.
    k, v = batch.clean_kv()
    ref_args = (batch.q, k, v, batch.cu_q, batch.cu_k)
    mask["alibi_slopes"] = alibi_slopes
    ref = reference.attention_varlen(*ref_args, seqused_k=batch.used, dtype=torch.float64, **mask)
    low = reference.attention_varlen(*ref_args, seqused_k=batch.used, dtype=batch.q.dtype, **mask)
    err = (out.double() - ref).abs().max().item()
    torch_err = (low.double() - ref).abs().max().item()
    assert err <= 2 * torch_err + OUT_ABS_FLOOR, (err, torch_err)


def check_varlen_grads(batch: Batch, grads, dout, *, causal, window, softcap, alibi_slopes=None):
    dq, dk, dv = grads
    assert dq.shape == batch.q.shape and dk.shape == dv.shape == batch.k.shape
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert torch.isfinite(g).all(), f"{name} has non-finite elements (unwritten or NaN)"
    for b, (rows, keys, unused) in enumerate(batch.spans()):
        if rows.stop == rows.start or keys.stop == keys.start:
            # No (query, key) pair at all: every gradient of the sequence is exactly 0.
            assert (dq[rows] == 0).all() and (dk[keys] == 0).all() and (dv[keys] == 0).all()
        else:
            check_grads((dq[None, rows], dk[None, keys], dv[None, keys]), batch.q[None, rows],
                        batch.k[None, keys], batch.v[None, keys], dout[None, rows],
                        causal=causal, window=window, softcap=softcap,
                        alibi_slopes=batch.slopes_of(alibi_slopes, b))
        assert (dk[unused] == 0).all() and (dv[unused] == 0).all(), "keys past seqused_k need 0"


def run_forward(batch: Batch, *, backend, causal, window, softcap, alibi_slopes=None):
    out = torch.full_like(batch.q, math.nan)
    result, lse = flashcute.attention_varlen(
        *batch.args(), seqused_k=batch.used, causal=causal, window=window, softcap=softcap,
        alibi_slopes=alibi_slopes, return_lse=True, out=out, backend=backend)
    assert result is out
    return out, lse


def run_backward(batch: Batch, dout, *, backend, causal, window, softcap, deterministic=False,
                 alibi_slopes=None):
    mask = dict(causal=causal, window=window, softcap=softcap, alibi_slopes=alibi_slopes)
    out, lse = flashcute.attention_varlen(*batch.args(), seqused_k=batch.used, return_lse=True,
                                          **mask)
    bufs = [torch.full_like(x, math.nan) for x in (batch.q, batch.k, batch.v)]
    grads = flashcute.attention_varlen_backward(
        dout, batch.q, batch.k, batch.v, out, lse, batch.cu_q, batch.cu_k, batch.max_q,
        batch.max_k, seqused_k=batch.used, dq=bufs[0], dk=bufs[1], dv=bufs[2],
        deterministic=deterministic, backend=backend, **mask)
    assert all(g is b for g, b in zip(grads, bufs))
    return grads


def _mask_cases():
    """(causal, window, softcap, seqused, nheads_kv): every window with and without causal,
    softcap and seqused_k on some of them, GQA 3:1 and MHA alternating."""
    cases = []
    for i, (causal, window) in enumerate((c, w) for c in (False, True) for w in WINDOWS):
        softcap = 15.0 if i % 3 == 1 else 0.0
        for seqused in (False, True):
            nheads_kv = 2 if (i + seqused) % 2 == 0 else 6
            cases.append(pytest.param(
                causal, window, softcap, seqused, nheads_kv,
                id=f"{'causal' if causal else 'full'}-w{window[0]}_{window[1]}"
                   f"{'-cap' if softcap else ''}{'-used' if seqused else ''}-kv{nheads_kv}"))
    return cases


@pytest.mark.parametrize("backend", _fwd_backends(HEADDIM))
@pytest.mark.parametrize("causal, window, softcap, seqused, nheads_kv", _mask_cases())
def test_forward(gen, backend, causal, window, softcap, seqused, nheads_kv):
    batch = Batch(gen, MIXED, nheads_kv=nheads_kv, seqused=seqused)
    out, lse = run_forward(batch, backend=backend, causal=causal, window=window, softcap=softcap)
    check_varlen_forward(batch, out, lse, causal=causal, window=window, softcap=softcap)


# Causal with many query tiles: the longest sequence sets the tile pairs (an even and an odd
# count at 128- and 192-row tiles), the others pair their own tiles, from one tile to all,
# with every partial-tile remainder class (row shifts of 0, 64 and 128 rows).
LONG_MIXED = {
    "max1100": [(1100, 1100), (1000, 700), (577, 577), (385, 900), (191, 191), (0, 5), (64, 0),
                (833, 833), (1, 1), (449, 449), (130, 1100)],
    "max959": [(959, 959), (768, 768), (700, 300), (129, 129), (0, 0), (63, 64), (959, 0),
               (320, 320), (193, 500)],
}


@pytest.mark.parametrize("backend", _fwd_backends(HEADDIM))
@pytest.mark.parametrize("seqs", list(LONG_MIXED.values()), ids=list(LONG_MIXED))
@pytest.mark.parametrize("seqused", [False, True])
def test_causal_tiles_per_sequence(gen, backend, seqs, seqused):
    batch = Batch(gen, seqs, seqused=seqused)
    out, lse = run_forward(batch, backend=backend, causal=True, window=NO_WINDOW, softcap=0.0)
    check_varlen_forward(batch, out, lse, causal=True, window=NO_WINDOW, softcap=0.0)


@pytest.mark.parametrize("backend", _bwd_backends(HEADDIM))
@pytest.mark.parametrize("causal, window, softcap, seqused, nheads_kv", _mask_cases())
def test_backward(gen, backend, causal, window, softcap, seqused, nheads_kv):
    batch = Batch(gen, MIXED, nheads_kv=nheads_kv, seqused=seqused)
    dout = torch.randn(batch.q.shape, generator=gen, device="cuda", dtype=batch.q.dtype)
    grads = run_backward(batch, dout, backend=backend, causal=causal, window=window,
                         softcap=softcap)
    check_varlen_grads(batch, grads, dout, causal=causal, window=window, softcap=softcap)


@pytest.mark.parametrize("backend", _fwd_backends(HEADDIM))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqused", [False, True])
def test_autograd(gen, backend, causal, seqused):
    """attention_varlen is differentiable: autograd's gradients pass the same checks (the
    forward's path picks the backward as for fixed-length calls)."""
    batch = Batch(gen, MIXED, seqused=seqused)
    dout = torch.randn(batch.q.shape, generator=gen, device="cuda", dtype=batch.q.dtype)
    leaves = [x.detach().clone().requires_grad_(True) for x in (batch.q, batch.k, batch.v)]
    out = flashcute.attention_varlen(*leaves, batch.cu_q, batch.cu_k, batch.max_q, batch.max_k,
                                     seqused_k=batch.used, causal=causal, window=(W, -1),
                                     backend=backend)
    assert out.requires_grad
    out.backward(dout)
    check_varlen_grads(batch, [x.grad for x in leaves], dout, causal=causal, window=(W, -1),
                       softcap=0.0)


@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_backward_is_reproducible(gen, causal):
    if "ampere" not in _bwd_backends(HEADDIM):
        pytest.skip("no Ampere-path backward for this head dim")
    batch = Batch(gen, MIXED, seqused=True)
    dout = torch.randn(batch.q.shape, generator=gen, device="cuda", dtype=batch.q.dtype)
    first = run_backward(batch, dout, backend="ampere", causal=causal, window=NO_WINDOW,
                         softcap=0.0, deterministic=True)
    second = run_backward(batch, dout, backend="ampere", causal=causal, window=NO_WINDOW,
                          softcap=0.0, deterministic=True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    check_varlen_grads(batch, first, dout, causal=causal, window=NO_WINDOW, softcap=0.0)


@pytest.mark.parametrize("backend", _fwd_backends(HEADDIM))
def test_compiled_training_step(gen, backend):
    """torch.compile(fullgraph=True) through the custom ops, forward and backward."""
    batch = Batch(gen, MIXED, seqused=True)
    dout = torch.randn(batch.q.shape, generator=gen, device="cuda", dtype=batch.q.dtype)

    def step(q, k, v, cu_q, cu_k, used):
        out = flashcute.attention_varlen(q, k, v, cu_q, cu_k, batch.max_q, batch.max_k,
                                         seqused_k=used, causal=True, backend=backend)
        return out

    compiled = torch.compile(step, fullgraph=True)
    leaves = [x.detach().clone().requires_grad_(True) for x in (batch.q, batch.k, batch.v)]
    out = compiled(*leaves, batch.cu_q, batch.cu_k, batch.used)
    out.backward(dout)
    lse = flashcute.attention_varlen(*batch.args(), seqused_k=batch.used, causal=True,
                                     return_lse=True, backend=backend)[1]
    check_varlen_forward(batch, out.detach(), lse, causal=True, window=NO_WINDOW, softcap=0.0)
    check_varlen_grads(batch, [x.grad for x in leaves], dout, causal=True, window=NO_WINDOW,
                       softcap=0.0)


@pytest.mark.parametrize("backend", _fwd_backends(HEADDIM))
@pytest.mark.parametrize("causal", [False, True])
def test_equal_lengths_match_the_dense_call(gen, backend, causal):
    """Sequences of one length packed give what the fixed-length call of the same batch gives."""
    nseq, seqlen = 3, 333
    batch = Batch(gen, [(seqlen, seqlen)] * nseq)
    dense = [x.view(nseq, seqlen, *x.shape[1:]) for x in (batch.q, batch.k, batch.v)]
    out, lse = flashcute.attention_varlen(*batch.args(), causal=causal, return_lse=True,
                                          backend=backend)
    want, want_lse = flashcute.attention(*dense, causal=causal, return_lse=True, backend=backend)
    tol = 1e-2 if batch.q.dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(out.view_as(want), want, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.view(lse.shape[0], nseq, seqlen).transpose(0, 1), want_lse,
                               atol=1e-3, rtol=1e-4)
    dout = torch.randn(batch.q.shape, generator=gen, device="cuda", dtype=batch.q.dtype)
    grads = flashcute.attention_varlen_backward(dout, *batch.args()[:3], out, lse,
                                                *batch.args()[3:], causal=causal)
    want_grads = flashcute.attention_backward(dout.view_as(want), *dense, want, want_lse,
                                              causal=causal)
    for got, ref in zip(grads, want_grads):
        torch.testing.assert_close(got.view_as(ref), ref, atol=2 * tol, rtol=2 * tol)


@pytest.mark.parametrize("backend", _fwd_backends(HEADDIM))
def test_no_keys_at_all(gen, backend):
    """A batch without a single key: zeros, lse -inf, zero dq."""
    batch = Batch(gen, [(5, 0), (130, 0), (0, 0)])
    out, lse = run_forward(batch, backend=backend, causal=False, window=NO_WINDOW, softcap=0.0)
    assert (out == 0).all() and torch.isneginf(lse).all()
    for bwd in _bwd_backends(HEADDIM):
        dout = torch.randn(batch.q.shape, generator=gen, device="cuda", dtype=batch.q.dtype)
        dq, dk, dv = run_backward(batch, dout, backend=bwd, causal=False, window=NO_WINDOW,
                                  softcap=0.0)
        assert (dq == 0).all() and dk.numel() == dv.numel() == 0


@pytest.mark.parametrize("backend", _fwd_backends(HEADDIM))
def test_many_short_sequences_and_one_long(gen, backend):
    """Many sequences of a few rows beside one longer than a few tiles (grid sized from it)."""
    seqs = [(3, 5), (1, 2), (7, 7), (2, 9)] * 16 + [(1500, 1700)]
    batch = Batch(gen, seqs, nheads=4, nheads_kv=4, seqused=True)
    out, lse = run_forward(batch, backend=backend, causal=True, window=NO_WINDOW, softcap=0.0)
    check_varlen_forward(batch, out, lse, causal=True, window=NO_WINDOW, softcap=0.0)
    dout = torch.randn(batch.q.shape, generator=gen, device="cuda", dtype=batch.q.dtype)
    for bwd in _bwd_backends(HEADDIM):
        grads = run_backward(batch, dout, backend=bwd, causal=True, window=NO_WINDOW, softcap=0.0)
        check_varlen_grads(batch, grads, dout, causal=True, window=NO_WINDOW, softcap=0.0)


def _launch_forward(batch: Batch, out, lse, *, causal, workspace):
    """The binding's Hopper-path forward of a packed batch, with or without a workspace."""
    from torch.utils.dlpack import to_dlpack

    from flashcute._dispatch import choose_backend
    from flashcute.varlen import varlen_extension

    ext = varlen_extension()
    code = choose_backend("hopper", int(ext.device_capability(batch.q.device.index)),
                          headdim=batch.q.shape[-1], dtype=DTYPE)
    capsule = lambda x: None if x is None else to_dlpack(x)  # noqa: E731
    ext.forward(capsule(batch.q), capsule(batch.k), capsule(batch.v), capsule(out), capsule(lse),
                batch.q.shape[-1] ** -0.5, causal, code, torch.cuda.current_stream().cuda_stream,
                capsule(workspace), -1, -1, 0.0, None, capsule(batch.cu_q), capsule(batch.cu_k),
                capsule(batch.used), batch.max_q, batch.max_k)


@pytest.mark.skipif(not HOPPER_DIMS, reason="no Hopper-path forward here")
@pytest.mark.parametrize("headdim", HOPPER_DIMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqused", [False, True])
def test_claimed_tile_order(gen, headdim, causal, seqused):
    """A packed batch on the Hopper path claims its tiles through the workspace's counter
    (zeroed by the call): every tile runs once, so out and lse are bit for bit those of the
    fixed order (no workspace), eagerly and replayed from a CUDA graph, with several claims
    per CTA, and right against the reference."""
    from flashcute.varlen import varlen_extension

    lengths = [(37 * i % 700 + 1, 53 * i % 900) for i in range(60)] + [(0, 5), (2100, 1900)]
    batch = Batch(gen, lengths, nheads=8, nheads_kv=2, headdim=headdim, seqused=seqused)
    ext = varlen_extension()
    nbytes = int(ext.forward_workspace_size(
        len(lengths), batch.max_q, batch.max_k, 8, 2, headdim, DTYPE, causal,
        int(ext.BACKEND_HOPPER), batch.q.device.index, total_q=batch.q.shape[0],
        total_k=batch.k.shape[0], seqused_k=batch.used is not None))
    assert nbytes > 0, "the Hopper path's varlen forward asks for its counter"

    def fresh():
        return (torch.full_like(batch.q, math.nan),
                torch.full((8, batch.q.shape[0]), math.nan, device="cuda", dtype=torch.float32))

    fixed_out, fixed_lse = fresh()
    _launch_forward(batch, fixed_out, fixed_lse, causal=causal, workspace=None)
    check_varlen_forward(batch, fixed_out, fixed_lse, causal=causal, window=NO_WINDOW, softcap=0.0)
    check_claimed_order(lambda out, lse, workspace: _launch_forward(batch, out, lse, causal=causal,
                                                                    workspace=workspace),
                        fresh, (fixed_out, fixed_lse), nbytes, rounds=3)


@pytest.mark.parametrize("backend", _fwd_backends(HEADDIM))
def test_flash_attn_varlen_func(gen, backend):
    batch = Batch(gen, MIXED)
    out, lse, _ = flashcute.flash_attn_varlen_func(*batch.args(), causal=True,
                                                   window_size=(W, 0), return_attn_probs=True)
    check_varlen_forward(batch, out, lse, causal=True, window=(W, 0), softcap=0.0)


# ---------------------------------------------------------------------------------------
# ALiBi: the distance |i + seqlen_k - seqlen_q - j| of each sequence's own lengths.


def _slopes(gen, batch: Batch, per_sequence: bool) -> torch.Tensor:
    """(nheads,) geometric slopes, or (batch, nheads) random ones in [0.01, 0.5]."""
    nheads = batch.q.shape[1]
    if not per_sequence:
        return torch.tensor([2.0 ** (-8.0 * (h + 1) / nheads) for h in range(nheads)],
                            dtype=torch.float32, device="cuda")
    u = torch.rand((len(batch.seqs), nheads), generator=gen, device="cuda", dtype=torch.float32)
    return 0.01 + 0.49 * u


def _alibi_cases():
    """(causal, window, softcap, seqused, per-sequence slopes): ALiBi alone and with causal,
    windows and softcap, with and without seqused_k (whose length the distance takes)."""
    cases = []
    for i, (causal, window, softcap) in enumerate([
        (False, NO_WINDOW, 0.0), (True, NO_WINDOW, 0.0), (False, (W, W), 0.0),
        (True, (W, -1), 0.0), (False, NO_WINDOW, 15.0), (True, (W, 0), 15.0),
    ]):
        for seqused in (False, True):
            per_sequence = (i + seqused) % 2 == 1
            cases.append(pytest.param(
                causal, window, softcap, seqused, per_sequence,
                id=f"{'causal' if causal else 'full'}-w{window[0]}_{window[1]}"
                   f"{'-cap' if softcap else ''}{'-used' if seqused else ''}"
                   f"-{'slopes_bh' if per_sequence else 'slopes_h'}"))
    return cases


@pytest.mark.parametrize("backend", _fwd_backends(HEADDIM))
@pytest.mark.parametrize("causal, window, softcap, seqused, per_sequence", _alibi_cases())
def test_forward_alibi(gen, backend, causal, window, softcap, seqused, per_sequence):
    batch = Batch(gen, MIXED, seqused=seqused)
    slopes = _slopes(gen, batch, per_sequence)
    mask = dict(causal=causal, window=window, softcap=softcap, alibi_slopes=slopes)
    out, lse = run_forward(batch, backend=backend, **mask)
    check_varlen_forward(batch, out, lse, **mask)


@pytest.mark.parametrize("backend", _bwd_backends(HEADDIM))
@pytest.mark.parametrize("causal, window, softcap, seqused, per_sequence", _alibi_cases())
def test_backward_alibi(gen, backend, causal, window, softcap, seqused, per_sequence):
    batch = Batch(gen, MIXED, seqused=seqused)
    slopes = _slopes(gen, batch, per_sequence)
    mask = dict(causal=causal, window=window, softcap=softcap, alibi_slopes=slopes)
    dout = torch.randn(batch.q.shape, generator=gen, device="cuda", dtype=batch.q.dtype)
    grads = run_backward(batch, dout, backend=backend, **mask)
    check_varlen_grads(batch, grads, dout, **mask)


@pytest.mark.parametrize("backend", _fwd_backends(HEADDIM))
@pytest.mark.parametrize("causal", [False, True])
def test_alibi_equal_lengths_match_the_dense_call(gen, backend, causal):
    """Sequences of one length with per-sequence slopes give the fixed-length call's output,
    lse and gradients: the packed call reads the slope row of its sequence."""
    nseq, seqlen = 3, 333
    batch = Batch(gen, [(seqlen, seqlen)] * nseq)
    slopes = _slopes(gen, batch, True)
    dense = [x.view(nseq, seqlen, *x.shape[1:]) for x in (batch.q, batch.k, batch.v)]
    out, lse = flashcute.attention_varlen(*batch.args(), causal=causal, alibi_slopes=slopes,
                                          return_lse=True, backend=backend)
    want, want_lse = flashcute.attention(*dense, causal=causal, alibi_slopes=slopes,
                                         return_lse=True, backend=backend)
    tol = 1e-2 if batch.q.dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(out.view_as(want), want, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.view(lse.shape[0], nseq, seqlen).transpose(0, 1), want_lse,
                               atol=1e-3, rtol=1e-4)
    dout = torch.randn(batch.q.shape, generator=gen, device="cuda", dtype=batch.q.dtype)
    grads = flashcute.attention_varlen_backward(dout, *batch.args()[:3], out, lse,
                                                *batch.args()[3:], causal=causal,
                                                alibi_slopes=slopes)
    want_grads = flashcute.attention_backward(dout.view_as(want), *dense, want, want_lse,
                                              causal=causal, alibi_slopes=slopes)
    for got, ref in zip(grads, want_grads):
        torch.testing.assert_close(got.view_as(ref), ref, atol=2 * tol, rtol=2 * tol)


@pytest.mark.parametrize("backend", _fwd_backends(HEADDIM))
def test_alibi_autograd_and_compiled(gen, backend):
    """ALiBi through autograd (eager) and torch.compile(fullgraph=True) (the custom ops)."""
    batch = Batch(gen, MIXED, seqused=True)
    slopes = _slopes(gen, batch, True)
    dout = torch.randn(batch.q.shape, generator=gen, device="cuda", dtype=batch.q.dtype)
    mask = dict(causal=True, window=NO_WINDOW, softcap=0.0, alibi_slopes=slopes)

    def step(q, k, v, cu_q, cu_k, used, s):
        return flashcute.attention_varlen(q, k, v, cu_q, cu_k, batch.max_q, batch.max_k,
                                          seqused_k=used, causal=True, alibi_slopes=s,
                                          backend=backend)

    for fn in (step, torch.compile(step, fullgraph=True)):
        leaves = [x.detach().clone().requires_grad_(True) for x in (batch.q, batch.k, batch.v)]
        out = fn(*leaves, batch.cu_q, batch.cu_k, batch.used, slopes)
        out.backward(dout)
        lse = flashcute.attention_varlen(*batch.args(), seqused_k=batch.used, causal=True,
                                         alibi_slopes=slopes, return_lse=True,
                                         backend=backend)[1]
        check_varlen_forward(batch, out.detach(), lse, **mask)
        check_varlen_grads(batch, [x.grad for x in leaves], dout, **mask)


@pytest.mark.parametrize("backend", _fwd_backends(HEADDIM))
def test_flash_attn_varlen_func_alibi(gen, backend):
    batch = Batch(gen, MIXED)
    slopes = _slopes(gen, batch, True)
    out, lse, _ = flashcute.flash_attn_varlen_func(*batch.args(), causal=True,
                                                   window_size=(W, 0), alibi_slopes=slopes,
                                                   return_attn_probs=True)
    check_varlen_forward(batch, out, lse, causal=True, window=(W, 0), softcap=0.0,
                         alibi_slopes=slopes)
