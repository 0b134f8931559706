"""Gradients of flashcute.attention on a GPU, against float64 autograd through the reference.

Accuracy rule, as for the forward: each of dq, dk, dv may differ from the float64 gradient by
at most twice PyTorch's own error at the input precision (autograd through
``reference.attention(..., dtype=q.dtype)``), plus a small floor for cases where that error is
exactly zero: 1e-4 of the gradients' scale (the largest float64 gradient of the three). With
one key, for example, dk is exactly 0 in exact arithmetic and PyTorch happens to round to 0
too, while a fused kernel sums rowsum(dO∘O) and dO·Vᵀ in different orders.

PyTorch's error is the larger of two PyTorch computations in the input dtype: autograd through
the reference, and the FlashAttention backward formula (``fa_formula_grads``), whose softmax
term rowsum(dO∘O) uses the forward's output rounded to the input dtype, as every fused backward
must (the unrounded output is never stored). Autograd never sees that rounding; for rows that
attend to few keys it is the larger error. Covered: the autograd route (eager, torch.compile, CUDA graphs), the DLPack API
``attention_backward`` with given buffers and strided inputs, GQA, deterministic mode.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
from flashcute import reference  # noqa: E402

from test_gpu_forward import SUPPORT, _sizes, gen, make_qkv  # noqa: E402,F401

pytestmark = pytest.mark.gpu

ABS_FLOOR = 1e-5
REL_FLOOR = 1e-4


def _bwd_support() -> tuple[list[int], list[str]]:
    return SUPPORT.get("ampere", ([], []))


BWD_HEAD_DIMS, BWD_DTYPES = _bwd_support()
# Head dims with a Hopper-path backward on this GPU (empty elsewhere): there the default
# backward is the Hopper one and backend="ampere" tests the other.
HOPPER_BWD_HEAD_DIMS = (
    flashcute.build_info()["backends"]["hopper"]["backward_head_dims"] if "hopper" in SUPPORT else []
)
# The forward path the autograd route is tested with: the GPU's default and the Ampere path.
# A forward on the Ampere path differentiates on the Ampere path too, so both backwards run.
FWD_BACKENDS = [None] + (["ampere"] if "hopper" in SUPPORT else [])
BWD_BACKENDS = [None] + (["ampere"] if HOPPER_BWD_HEAD_DIMS else [])


def ref_grads(q, k, v, dout, *, causal, dtype, softmax_scale=None):
    leaves = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v)]
    out = reference.attention(*leaves, causal=causal, softmax_scale=softmax_scale, dtype=dtype)
    out.backward(dout.to(out.dtype))
    return [x.grad for x in leaves]


def fa_formula_grads(q, k, v, dout, *, causal, softmax_scale=None):
    """dq, dk, dv by the FlashAttention backward formula in PyTorch, matmuls in q's dtype."""
    dtype, nheads, headdim = q.dtype, q.shape[2], q.shape[3]
    group = nheads // max(k.shape[2], 1)
    scale = 1.0 / math.sqrt(headdim) if softmax_scale is None else softmax_scale
    out, lse = reference.attention(q, k, v, causal=causal, softmax_scale=scale,
                                   return_lse=True, dtype=dtype)
    qt, ot, dot = (x.transpose(1, 2) for x in (q, out.to(dtype), dout))
    kt, vt = (x.transpose(1, 2).repeat_interleave(group, dim=1) for x in (k, v))
    scores = torch.matmul(qt, kt.transpose(-1, -2)).float() * scale
    if causal:
        rows = torch.arange(q.shape[1], device=q.device)[:, None]
        cols = torch.arange(k.shape[1], device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows + (k.shape[1] - q.shape[1]), float("-inf"))
    finite_lse = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)
    p = torch.exp(scores - finite_lse.unsqueeze(-1))
    dp = torch.matmul(dot, vt.transpose(-1, -2)).float()
    row_dot = (dot.float() * ot.float()).sum(-1, keepdim=True)
    ds = (p * (dp - row_dot)).to(dtype)
    dq = torch.matmul(ds, kt).float() * scale
    dk = torch.matmul(ds.transpose(-1, -2), qt).float() * scale
    dv = torch.matmul(p.to(dtype).transpose(-1, -2), dot).float()

    def to_layout(g, heads):
        g = g.reshape(g.shape[0], heads, -1, *g.shape[2:]).sum(2) if heads != g.shape[1] else g
        return g.transpose(1, 2).to(dtype)

    return dq.transpose(1, 2).to(dtype), to_layout(dk, k.shape[2]), to_layout(dv, k.shape[2])


def check_grads(grads, q, k, v, dout, *, causal, softmax_scale=None):
    exact = ref_grads(q, k, v, dout, causal=causal, dtype=torch.float64, softmax_scale=softmax_scale)
    autograd_low = ref_grads(q, k, v, dout, causal=causal, dtype=q.dtype, softmax_scale=softmax_scale)
    formula_low = fa_formula_grads(q, k, v, dout, causal=causal, softmax_scale=softmax_scale)
    scale = max((g.abs().max().item() for g in exact if g.numel()), default=0.0)
    for name, got, ref, lowa, lowf, like in zip("qkv", grads, exact, autograd_low, formula_low,
                                                 (q, k, v)):
        name = "d" + name
        assert got.shape == like.shape and got.dtype == like.dtype, name
        assert torch.isfinite(got).all(), f"{name} has non-finite elements (unwritten or NaN)"
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


def autograd_grads(q, k, v, dout, *, causal, backend, softmax_scale=None):
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    out = flashcute.attention(*leaves, causal=causal, softmax_scale=softmax_scale, backend=backend)
    assert out.requires_grad
    out.backward(dout)
    return [x.grad for x in leaves]


def randn_like(gen, x):
    return torch.randn(x.shape, generator=gen, device=x.device, dtype=x.dtype)


# ---------------------------------------------------------------------------------------
# The grid through autograd: head dims x dtypes x causal x sequence lengths.

SEQLENS = [(1, 1), (17, 17), (333, 333), (17, 333), (333, 17), (1, 2049), (2049, 1)]
LONG = [(2049, 2049)]


def _grid():
    cases = []
    for fwd_backend in FWD_BACKENDS:
        for headdim in BWD_HEAD_DIMS:
            seqlens = SEQLENS + (LONG if headdim in (64, 128) or headdim in HOPPER_BWD_HEAD_DIMS else [])
            for dtype in BWD_DTYPES:
                for causal in (False, True):
                    for seqlen_q, seqlen_k in seqlens:
                        cases.append(pytest.param(
                            fwd_backend, headdim, dtype, causal, seqlen_q, seqlen_k,
                            id=f"fwd-{fwd_backend or 'default'}-hd{headdim}-{dtype}-"
                            f"{'causal' if causal else 'full'}-{seqlen_q}x{seqlen_k}",
                        ))
    return cases


@pytest.mark.parametrize("fwd_backend, headdim, dtype, causal, seqlen_q, seqlen_k", _grid())
def test_backward_grid(gen, fwd_backend, headdim, dtype, causal, seqlen_q, seqlen_k):
    batch, nheads = _sizes(seqlen_q, seqlen_k)
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads, headdim, dtype)
    dout = randn_like(gen, q)
    grads = autograd_grads(q, k, v, dout, causal=causal, backend=fwd_backend)
    check_grads(grads, q, k, v, dout, causal=causal)


# ---------------------------------------------------------------------------------------
# The DLPack API: given (poisoned) buffers, GQA sums, strided inputs, scale.


def _per_dim(head_dims=None):
    return [
        pytest.param(hd, dt, id=f"hd{hd}-{dt}")
        for hd in BWD_HEAD_DIMS for dt in BWD_DTYPES if head_dims is None or hd in head_dims
    ]


def forward_for_backward(q, k, v, *, causal, softmax_scale=None):
    with torch.no_grad():
        return flashcute.attention(
            q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True
        )


@pytest.mark.parametrize("headdim, dtype", _per_dim())
@pytest.mark.parametrize("nheads, nheads_kv", [(8, 2), (6, 1)], ids=["gqa8to2", "mqa6to1"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(128, 333), (333, 128)], ids=["128x333", "333x128"])
@pytest.mark.parametrize("bwd_backend", BWD_BACKENDS, ids=lambda b: f"bwd-{b or 'default'}")
def test_grouped_query_into_poisoned_buffers(gen, headdim, dtype, nheads, nheads_kv, causal,
                                             seqlen_q, seqlen_k, bwd_backend):
    q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype)
    dout = randn_like(gen, q)
    out, lse = forward_for_backward(q, k, v, causal=causal)
    bufs = [torch.full_like(x, math.nan) for x in (q, k, v)]
    result = flashcute.attention_backward(
        dout, q, k, v, out, lse, causal=causal, dq=bufs[0], dk=bufs[1], dv=bufs[2],
        backend=bwd_backend,
    )
    assert all(r is b for r, b in zip(result, bufs))
    check_grads(result, q, k, v, dout, causal=causal)


@pytest.mark.parametrize("headdim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1500, 1100), (1100, 1500)], ids=["1500x1100", "1100x1500"])
def test_long_query_loop_per_key_block(gen, headdim, causal, seqlen_q, seqlen_k):
    """Many query blocks per key block (GQA 4:1): the Hopper hd 64 and 128 kernels then issue
    each block's dQ one block late, which short loops do not."""
    if headdim not in BWD_HEAD_DIMS or "bfloat16" not in BWD_DTYPES:
        pytest.skip(f"headdim {headdim} bf16 not built")
    q, k, v = make_qkv(gen, 1, seqlen_q, seqlen_k, 8, 2, headdim, "bfloat16")
    dout = randn_like(gen, q)
    out, lse = forward_for_backward(q, k, v, causal=causal)
    bufs = [torch.full_like(x, math.nan) for x in (q, k, v)]
    result = flashcute.attention_backward(dout, q, k, v, out, lse, causal=causal,
                                          dq=bufs[0], dk=bufs[1], dv=bufs[2])
    check_grads(result, q, k, v, dout, causal=causal)


# (batch, seqlen_q, seqlen_k, nheads_kv) with more key-block CTAs than the 132 SMs of an H100
# or H200, not a multiple of them: 144 CTAs of 128 keys, or for hd 256 140 and 133 of 80 keys.
_SPLIT_SHAPES = {
    "short": {64: (3, 1100, 1000, 6), 96: (3, 1100, 1000, 6), 128: (3, 1100, 1000, 6),
              256: (2, 1100, 800, 7)},
    "long": {64: (2, 700, 1500, 6), 96: (2, 700, 1500, 6), 128: (2, 700, 1500, 6),
             256: (1, 700, 1500, 7)},
}


@pytest.mark.parametrize("headdim", [64, 96, 128, 256])
@pytest.mark.parametrize("shape", sorted(_SPLIT_SHAPES))
def test_split_last_wave(gen, headdim, shape):
    """The Hopper kernels split the last wave's key-block tiles into parts that walk a share of
    the query blocks each (across the GQA group's heads) and sum dK, dV in fp32."""
    if headdim not in BWD_HEAD_DIMS or "bfloat16" not in BWD_DTYPES:
        pytest.skip(f"headdim {headdim} bf16 not built")
    batch, seqlen_q, seqlen_k, nheads_kv = _SPLIT_SHAPES[shape][headdim]
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, 2 * nheads_kv, nheads_kv, headdim, "bfloat16")
    dout = randn_like(gen, q)
    out, lse = forward_for_backward(q, k, v, causal=False)
    bufs = [torch.full_like(x, math.nan) for x in (q, k, v)]
    result = flashcute.attention_backward(dout, q, k, v, out, lse, causal=False,
                                          dq=bufs[0], dk=bufs[1], dv=bufs[2])
    check_grads(result, q, k, v, dout, causal=False)


@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_causal_tail_in_key_block_order(gen, headdim):
    """A causal call's last pairs run key block by key block (plan_causal_tail): 4 × 6 kv heads
    (GQA 2:1) of 17-27 key blocks, more pairs than that tail, seqlen_q < seqlen_k."""
    if headdim not in HOPPER_BWD_HEAD_DIMS or "bfloat16" not in BWD_DTYPES:
        pytest.skip(f"no Hopper-path bf16 backward for head dim {headdim} in this build")
    q, k, v = make_qkv(gen, 4, 1500, 2100, 12, 6, headdim, "bfloat16")
    dout = randn_like(gen, q)
    out, lse = forward_for_backward(q, k, v, causal=True)
    bufs = [torch.full_like(x, math.nan) for x in (q, k, v)]
    result = flashcute.attention_backward(dout, q, k, v, out, lse, causal=True,
                                          dq=bufs[0], dk=bufs[1], dv=bufs[2], backend="hopper")
    check_grads(result, q, k, v, dout, causal=True)


# (causal, seqlen_q, seqlen_k, nheads, nheads_kv): 20 (batch, kv head) pairs of 258 key
# blocks take two dq_accum chunks (bwd_workspace.h): the buffer is zeroed again for the second.
_WORKSPACE_SHAPES = {
    "full": (False, 700, 900, 6, 3),
    "causal": (True, 700, 300, 6, 3),
    "two-chunks": (False, 80, 33000, 40, 20),
}


@pytest.mark.parametrize("headdim", [64, 128, 256])
@pytest.mark.parametrize("shape", sorted(_WORKSPACE_SHAPES))
def test_workspace_from_nan_filled_memory(gen, headdim, shape):
    """Nothing may depend on the workspace's earlier contents (the dQ accumulator, the counts):
    the backward runs on memory torch's allocator hands back from a freed NaN-filled buffer,
    with query blocks no key reaches (causal, seqlen_q > seqlen_k) and with two chunks."""
    if headdim not in HOPPER_BWD_HEAD_DIMS or "bfloat16" not in BWD_DTYPES:
        pytest.skip(f"no Hopper-path bf16 backward for head dim {headdim} in this build")
    causal, seqlen_q, seqlen_k, nheads, nheads_kv = _WORKSPACE_SHAPES[shape]
    q, k, v = make_qkv(gen, 1 if shape == "two-chunks" else 2, seqlen_q, seqlen_k, nheads, nheads_kv,
                       headdim, "bfloat16")
    dout = randn_like(gen, q)
    out, lse = forward_for_backward(q, k, v, causal=causal)
    torch.cuda.synchronize()
    poison = torch.full((64 << 20,), math.nan, device=q.device, dtype=torch.float32)
    del poison  # the allocator's cached block: the workspace below is carved from it
    result = flashcute.attention_backward(dout, q, k, v, out, lse, causal=causal, backend="hopper")
    check_grads(result, q, k, v, dout, causal=causal)


@pytest.mark.parametrize("headdim, dtype", _per_dim((64, 128, 256)))
@pytest.mark.parametrize("layout", ["bhsd", "padded"])
@pytest.mark.parametrize("bwd_backend", BWD_BACKENDS, ids=lambda b: f"bwd-{b or 'default'}")
def test_strided_inputs_and_grads(gen, headdim, dtype, layout, bwd_backend):
    q, k, v = make_qkv(gen, 2, 200, 300, 4, 2, headdim, dtype, layout=layout)
    dout = make_qkv(gen, 2, 200, 300, 4, 2, headdim, dtype, layout=layout)[0]
    out, lse = forward_for_backward(q, k, v, causal=True)
    bufs = [torch.full_like(x, math.nan) for x in make_qkv(gen, 2, 200, 300, 4, 2, headdim, dtype,
                                                           layout=layout)]
    grads = flashcute.attention_backward(dout, q, k, v, out, lse, causal=True,
                                         dq=bufs[0], dk=bufs[1], dv=bufs[2], backend=bwd_backend)
    check_grads(grads, q, k, v, dout, causal=True)


@pytest.mark.parametrize("bwd_backend", BWD_BACKENDS, ids=lambda b: f"bwd-{b or 'default'}")
def test_direct_route_rechecks_each_call_of_a_kept_signature(gen, bwd_backend):
    """The torch route keeps what its checks decided per call signature: a repeated signature
    computes from its own inputs (allocated gradients, then given ones), and a pointer that
    breaks 16-byte alignment under the same shapes and strides is still refused (dout, dq)."""
    headdim, dtype = (128 if 128 in BWD_HEAD_DIMS else BWD_HEAD_DIMS[-1]), BWD_DTYPES[0]
    for _ in range(2):
        q, k, v = make_qkv(gen, 2, 17, 333, 4, 2, headdim, dtype)
        dout = randn_like(gen, q)
        out, lse = forward_for_backward(q, k, v, causal=True)
        check_grads(flashcute.attention_backward(dout, q, k, v, out, lse, causal=True,
                                                 backend=bwd_backend), q, k, v, dout, causal=True)
    for _ in range(2):
        bufs = [torch.full_like(x, math.nan) for x in (q, k, v)]
        grads = flashcute.attention_backward(dout, q, k, v, out, lse, causal=True, dq=bufs[0],
                                             dk=bufs[1], dv=bufs[2], backend=bwd_backend)
        assert all(g is b for g, b in zip(grads, bufs))
        check_grads(grads, q, k, v, dout, causal=True)
    n = q.numel()
    flat = torch.randn(n + 8, generator=gen, device="cuda", dtype=q.dtype)
    shifted = flat[1 : n + 1].view(q.shape)
    assert shifted.stride() == q.stride()
    with pytest.raises(ValueError, match="16-byte aligned"):
        flashcute.attention_backward(shifted, q, k, v, out, lse, causal=True, backend=bwd_backend)
    with pytest.raises(ValueError, match="16-byte aligned"):
        flashcute.attention_backward(dout, q, k, v, out, lse, causal=True, dq=shifted,
                                     dk=bufs[1], dv=bufs[2], backend=bwd_backend)


@pytest.mark.parametrize("headdim, dtype", _per_dim((64, 128)))
@pytest.mark.parametrize("softmax_scale", [0.05, 0.5])
def test_softmax_scale(gen, headdim, dtype, softmax_scale):
    q, k, v = make_qkv(gen, 2, 257, 300, 4, 4, headdim, dtype)
    dout = randn_like(gen, q)
    grads = autograd_grads(q, k, v, dout, causal=True, backend=None, softmax_scale=softmax_scale)
    check_grads(grads, q, k, v, dout, causal=True, softmax_scale=softmax_scale)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q, seqlen_k, nheads", [(0, 17, 4), (17, 0, 4), (0, 0, 4), (0, 1500, 12)])
def test_empty_sequences_give_zero_grads(gen, causal, seqlen_q, seqlen_k, nheads):
    # (0, 1500, 12): 144 key-block CTAs with no query block to walk
    q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, nheads, nheads // 2, 64, "bfloat16")
    dout = randn_like(gen, q)
    grads = autograd_grads(q, k, v, dout, causal=causal, backend=None)
    for g, x in zip(grads, (q, k, v)):
        assert g.shape == x.shape and (g == 0).all()


def test_many_key_blocks_and_heads(gen):
    q, k, v = make_qkv(gen, 3, 1500, 1700, 12, 4, 128, "bfloat16")
    dout = randn_like(gen, q)
    grads = autograd_grads(q, k, v, dout, causal=True, backend=None)
    check_grads(grads, q, k, v, dout, causal=True)


def test_expanded_dout_from_sum(gen):
    """out.sum() hands the backward a stride-0 dout; it must still be right."""
    if 64 not in BWD_HEAD_DIMS or "float16" not in BWD_DTYPES:
        pytest.skip("headdim 64 float16 not built")
    q, k, v = make_qkv(gen, 2, 100, 120, 4, 4, 64, "float16")
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    flashcute.attention(*leaves).sum().backward()
    check_grads([x.grad for x in leaves], q, k, v, torch.ones_like(q), causal=False)


def test_side_stream(gen):
    q, k, v = make_qkv(gen, 2, 700, 900, 4, 2, 128, "bfloat16")
    dout = randn_like(gen, q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        grads = autograd_grads(q, k, v, dout, causal=True, backend=None)
    torch.cuda.current_stream().wait_stream(stream)
    check_grads(grads, q, k, v, dout, causal=True)


# ---------------------------------------------------------------------------------------
# Determinism.


@pytest.mark.parametrize("headdim, dtype", _per_dim())
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("bwd_backend", [None, "ampere"], ids=["det", "det-ampere"])
def test_bitwise_reproducible(gen, headdim, dtype, causal, bwd_backend):
    """deterministic=True must hold on every head dim, also with the Ampere path asked for by
    name (whose default design adds dQ with atomics)."""
    q, k, v = make_qkv(gen, 2, 777, 1000, 4, 2, headdim, dtype)
    dout = randn_like(gen, q)
    out, lse = forward_for_backward(q, k, v, causal=causal)
    runs = [flashcute.attention_backward(dout, q, k, v, out, lse, causal=causal,
                                         deterministic=True, backend=bwd_backend)
            for _ in range(3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    check_grads(runs[0], q, k, v, dout, causal=causal)


@pytest.mark.skipif(not HOPPER_BWD_HEAD_DIMS, reason="no Hopper-path backward on this GPU")
def test_hopper_backward_refuses_deterministic(gen):
    q, k, v = make_qkv(gen, 1, 64, 64, 2, 2, HOPPER_BWD_HEAD_DIMS[0], "bfloat16")
    out, lse = forward_for_backward(q, k, v, causal=False)
    with pytest.raises(ValueError, match=r"^backend='hopper': .*deterministic=True"):
        flashcute.attention_backward(q, q, k, v, out, lse, deterministic=True, backend="hopper")


def _needs_hd64_bf16(bwd_backend: str) -> None:
    """Skip unless this build and GPU run the hd 64 bf16 backward on ``bwd_backend``."""
    if bwd_backend == "hopper" and 64 not in HOPPER_BWD_HEAD_DIMS:
        pytest.skip("no Hopper-path backward for head dim 64 on this GPU")
    if 64 not in BWD_HEAD_DIMS or "bfloat16" not in BWD_DTYPES:
        pytest.skip("no Ampere-path bf16 kernels for head dim 64 in this build")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("bwd_backend", ["hopper", "ampere"])
def test_dq_accumulator_in_chunks(gen, causal, bwd_backend):
    """72 (batch, kv head) pairs × 64 key blocks exceed one dq_accum chunk (4096 CTAs): the
    launcher runs two chunks, each zeroing and converting its own heads."""
    _needs_hd64_bf16(bwd_backend)
    q, k, v = make_qkv(gen, 1, 100, 8192, 144, 72, 64, "bfloat16")
    dout = randn_like(gen, q)
    out, lse = forward_for_backward(q, k, v, causal=causal)
    bufs = [torch.full_like(x, math.nan) for x in (q, k, v)]
    grads = flashcute.attention_backward(dout, q, k, v, out, lse, causal=causal,
                                         dq=bufs[0], dk=bufs[1], dv=bufs[2], backend=bwd_backend)
    check_grads(grads, q, k, v, dout, causal=causal)


@pytest.mark.parametrize("bwd_backend", ["hopper", "ampere"])
def test_dq_accumulator_chunk_fits_the_grid(gen, bwd_backend):
    """4096 (batch, kv head) pairs of one key block each, 16 query heads per kv head: a chunk
    of 4096 pairs would be 65536 slots, one more than a grid dimension holds."""
    _needs_hd64_bf16(bwd_backend)
    q, k, v = make_qkv(gen, 2048, 16, 16, 32, 2, 64, "bfloat16")
    dout = randn_like(gen, q)
    out, lse = forward_for_backward(q, k, v, causal=False)
    grads = flashcute.attention_backward(dout, q, k, v, out, lse, backend=bwd_backend)
    check_grads(grads, q, k, v, dout, causal=False)


def test_deterministic_algorithms_flag_selects_deterministic_mode(gen):
    if 64 not in BWD_HEAD_DIMS or "bfloat16" not in BWD_DTYPES:
        pytest.skip("headdim 64 bf16 not built on the Ampere path (deterministic calls run there)")
    q, k, v = make_qkv(gen, 1, 900, 900, 4, 4, 64, "bfloat16")
    dout = randn_like(gen, q)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first = autograd_grads(q, k, v, dout, causal=False, backend=None)
        second = autograd_grads(q, k, v, dout, causal=False, backend=None)
    finally:
        torch.use_deterministic_algorithms(previous)
    for a, b in zip(first, second):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    check_grads(first, q, k, v, dout, causal=False)


# ---------------------------------------------------------------------------------------
# torch integration: custom ops, torch.compile, CUDA graphs.


def test_opcheck_forward_and_backward(gen):
    q, k, v = make_qkv(gen, 1, 65, 80, 4, 2, 64, "bfloat16")
    torch.library.opcheck(
        torch.ops.flashcute.attention_forward.default, (q, k, v, True, 0.125, None)
    )
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    torch.library.opcheck(
        torch.ops.flashcute.attention_forward.default, (*leaves, False, 0.125, None),
        test_utils=("test_schema", "test_autograd_registration", "test_faketensor"),
    )
    out, lse, _ = torch.ops.flashcute.attention_forward(q, k, v, True, 0.125, None)
    torch.library.opcheck(
        torch.ops.flashcute.attention_backward.default,
        (randn_like(gen, q), q, k, v, out, lse, True, 0.125, False, None),
    )


def test_eager_autograd_route_matches_the_custom_op(gen):
    """Eager calls on inputs that require grad run an autograd.Function over the direct
    routes, not the custom ops: the same output and LSE, gradients within the bound, and a
    second-order backward refused rather than silently wrong."""
    q, k, v = make_qkv(gen, 2, 129, 77, 6, 2, 64, "bfloat16")
    dout = randn_like(gen, q)
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    op_leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    out, lse = flashcute.attention(*leaves, causal=True, return_lse=True)
    op_out, op_lse, _ = torch.ops.flashcute.attention_forward(*op_leaves, True, 0.125, None)
    assert type(out.grad_fn).__name__ != type(op_out.grad_fn).__name__
    assert torch.equal(out, op_out) and torch.equal(lse, op_lse) and not lse.requires_grad
    check_grads(torch.autograd.grad(out, leaves, dout), q, k, v, dout, causal=True)
    check_grads(torch.autograd.grad(op_out, op_leaves, dout), q, k, v, dout, causal=True)
    out = flashcute.attention(*leaves, causal=True)
    dout_leaf = dout.clone().requires_grad_(True)
    dq = torch.autograd.grad(out, leaves, dout_leaf, create_graph=True)[0]
    with pytest.raises(RuntimeError, match="differentiate twice"):
        dq.float().sum().backward()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_torch_compile_fullgraph(gen, causal):
    torch._dynamo.reset()
    q, k, v = make_qkv(gen, 2, 300, 333, 8, 2, 128, "bfloat16")
    dout = randn_like(gen, q)

    @torch.compile(fullgraph=True)
    def loss_fn(q, k, v):
        out = flashcute.attention(q, k, v, causal=causal)
        return (out.float() * dout.float()).sum()

    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    loss_fn(*leaves).backward()
    check_grads([x.grad for x in leaves], q, k, v, dout, causal=causal)


def test_cuda_graph_capture_forward_and_backward(gen):
    q, k, v = make_qkv(gen, 2, 500, 600, 8, 4, 128, "bfloat16")
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    dout = randn_like(gen, q)

    def step():
        out = flashcute.attention(*leaves, causal=True)
        return (out, *torch.autograd.grad(out, leaves, dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()

    fresh = make_qkv(gen, 2, 500, 600, 8, 4, 128, "bfloat16")
    with torch.no_grad():
        for leaf, x in zip(leaves, fresh):
            leaf.copy_(x)
        dout.copy_(randn_like(gen, dout))
    graph.replay()
    torch.cuda.synchronize()
    check_grads(static[1:], *fresh, dout, causal=True)
