"""flashcute.attention forward on a GPU, against flashcute.reference in float64.

Accuracy rule: flashcute's output may differ from the float64 reference by at most twice
PyTorch's own error at the input precision (``reference.attention(..., dtype=q.dtype)``),
plus a tiny absolute floor for cases where that error is exactly zero. The float32 lse is
held to a fixed tolerance (it is accumulated in float32 from the exact input values).

Every backend that this build compiles and this GPU can run gets the same grid.
"""

from __future__ import annotations

import math
import os
import zlib

import pytest

torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
from flashcute import reference  # noqa: E402

pytestmark = pytest.mark.gpu

ALL_HEAD_DIMS = [32, 64, 96, 128, 192, 256]
ALL_DTYPES = ["float16", "bfloat16"]
OUT_ABS_FLOOR = 1e-5
LSE_ATOL = 1e-3
LSE_RTOL = 1e-4


def _capability() -> int | None:
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return major * 10 + minor


def _usable_backends() -> dict[str, tuple[list[int], list[str]]]:
    """{backend: (head dims, dtypes)} for the backends built and runnable on this GPU."""
    try:
        info = flashcute.build_info()
    except ImportError:  # no extension: collect the Ampere grid; the gpu marker skips it
        return {"ampere": (ALL_HEAD_DIMS, ALL_DTYPES)}
    capability = _capability()
    usable = {}
    for name, support in info["backends"].items():
        if not support["head_dims"] or not support["dtypes"]:
            continue
        if capability is not None:
            if name == "hopper" and capability != 90:
                continue
            if name == "ampere" and capability < 80:
                continue
        elif name == "hopper":
            continue
        usable[name] = (list(support["head_dims"]), list(support["dtypes"]))
    return usable


SUPPORT = _usable_backends()
BACKENDS = list(SUPPORT)


def _sizes(seqlen_q: int, seqlen_k: int) -> tuple[int, int]:
    """(batch, nheads): keep batch * heads small for long sequences."""
    return (1, 2) if max(seqlen_q, seqlen_k) >= 1000 else (2, 3)


def _seed(request: pytest.FixtureRequest) -> int:
    return zlib.crc32(request.node.nodeid.encode())


@pytest.fixture
def gen(request):
    """A CUDA generator seeded from the test id: fresh but reproducible inputs per test."""
    return torch.Generator(device="cuda").manual_seed(_seed(request))


def make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype, layout="bshd"):
    """Random q, k, v of flashcute's (batch, seqlen, heads, headdim) shape in ``layout``.

    bshd: contiguous; bhsd: (batch, heads, seqlen, headdim) contiguous, transposed (SDPA's
    layout); padded: a headdim slice of a wider buffer; packed: q, k, v slices of one
    (batch, seqlen, 3, heads, headdim) tensor (needs seqlen_q == seqlen_k, nheads == nheads_kv).
    """
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype

    def randn(*shape):
        return torch.randn(shape, generator=gen, device="cuda", dtype=dtype)

    if layout == "packed":
        assert seqlen_q == seqlen_k and nheads == nheads_kv
        qkv = randn(batch, seqlen_q, 3, nheads, headdim)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    tensors = []
    for seqlen, heads in ((seqlen_q, nheads), (seqlen_k, nheads_kv), (seqlen_k, nheads_kv)):
        if layout == "bshd":
            x = randn(batch, seqlen, heads, headdim)
        elif layout == "bhsd":
            x = randn(batch, heads, seqlen, headdim).transpose(1, 2)
        elif layout == "padded":
            x = randn(batch, seqlen, heads, headdim + 8)[..., :headdim]
        else:
            raise ValueError(layout)
        tensors.append(x)
    return tuple(tensors)


def poisoned_like(q):
    """A NaN-filled output buffer of q's shape and dtype, so unwritten elements show."""
    return torch.full(q.shape, math.nan, dtype=q.dtype, device=q.device)


def check_claimed_order(launch, fresh, fixed, nbytes: int, rounds: int = 2) -> None:
    """A Hopper-path forward that claims its tiles through a workspace (poisoned before each
    call: the call zeroes its counter) gives bit for bit ``fixed`` (out, lse of the fixed
    order), eagerly and replayed from a CUDA graph. ``launch(out, lse, workspace)`` runs it,
    ``fresh()`` gives NaN-filled (out, lse)."""
    workspace = torch.full((nbytes,), 0x7F, dtype=torch.uint8, device="cuda")
    for _ in range(rounds):
        out, lse = fresh()
        workspace.fill_(0x7F)
        launch(out, lse, workspace)
        assert torch.equal(out, fixed[0]) and torch.equal(lse, fixed[1])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch(out, lse, workspace)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(out, lse, workspace)
    for _ in range(rounds):
        out.fill_(math.nan)
        lse.fill_(math.nan)
        workspace.fill_(0x7F)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fixed[0]) and torch.equal(lse, fixed[1])


def masked_rows(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """Number of leading query rows with no key to attend to."""
    if seqlen_k == 0:
        return seqlen_q
    return max(seqlen_q - seqlen_k, 0) if causal else 0


def check_close(out, lse, q, k, v, *, causal, softmax_scale=None):
    """Assert out (and lse unless None) against the float64 reference by the project's rule."""
    batch, seqlen_q, nheads, _ = q.shape
    ref, ref_lse = reference.attention(
        q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True, dtype=torch.float64
    )
    low = reference.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, dtype=q.dtype)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.isfinite(out).all(), "output has non-finite elements (unwritten or NaN)"
    masked = masked_rows(seqlen_q, k.shape[1], causal)
    if masked:
        assert (out[:, :masked] == 0).all(), "rows with no key must be exactly 0"
    if out.numel():
        err = (out.double() - ref).abs().max().item()
        torch_err = (low.double() - ref).abs().max().item()
        assert err <= 2 * torch_err + OUT_ABS_FLOOR, (
            f"max |flashcute - float64| = {err:.3g} > 2 * torch's {q.dtype} error "
            f"{torch_err:.3g} + {OUT_ABS_FLOOR}"
        )
    if lse is None:
        return
    assert lse.dtype == torch.float32 and lse.shape == (batch, nheads, seqlen_q)
    assert not torch.isnan(lse).any(), "lse has NaN"
    if masked:
        assert torch.isneginf(lse[..., :masked]).all(), "rows with no key must have lse -inf"
    lse, ref_lse = lse[..., masked:], ref_lse[..., masked:]
    assert torch.isfinite(lse).all()
    if lse.numel():
        err = (lse.double() - ref_lse).abs()
        tol = LSE_ATOL + LSE_RTOL * ref_lse.abs()
        worst = (err - tol).argmax()
        assert (err <= tol).all(), (
            f"lse: |flashcute - float64| = {err.flatten()[worst].item():.3g} exceeds "
            f"{tol.flatten()[worst].item():.3g}"
        )


def run_checked(q, k, v, *, causal, backend, softmax_scale=None):
    """Call flashcute with a poisoned out= and return_lse=True, then check everything."""
    out = poisoned_like(q)
    result, lse = flashcute.attention(
        q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True, out=out,
        backend=backend,
    )
    assert result is out
    check_close(result, lse, q, k, v, causal=causal, softmax_scale=softmax_scale)
    return result, lse


# ---------------------------------------------------------------------------------------
# The main grid: head dims x dtypes x causal x sequence lengths, per backend.

SQUARE_SEQLENS = [(1, 1), (17, 17), (333, 333)]
LONG_SEQLENS = [(2049, 2049)]
LONG_HEAD_DIMS = (64, 128)
RAGGED_SEQLENS = [(17, 333), (333, 17), (1, 2049), (2049, 1), (128, 1000), (1000, 128)]


def _grid():
    cases = []
    for backend, (head_dims, dtypes) in SUPPORT.items():
        for headdim in head_dims:
            seqlens = SQUARE_SEQLENS + RAGGED_SEQLENS
            if headdim in LONG_HEAD_DIMS:
                seqlens = seqlens + LONG_SEQLENS
            for dtype in dtypes:
                for causal in (False, True):
                    for seqlen_q, seqlen_k in seqlens:
                        cases.append(
                            pytest.param(
                                backend, headdim, dtype, causal, seqlen_q, seqlen_k,
                                id=f"{backend}-hd{headdim}-{dtype}-"
                                f"{'causal' if causal else 'full'}-{seqlen_q}x{seqlen_k}",
                            )
                        )
    return cases


@pytest.mark.parametrize("backend, headdim, dtype, causal, seqlen_q, seqlen_k", _grid())
def test_forward_grid(gen, backend, headdim, dtype, causal, seqlen_q, seqlen_k):
    batch, nheads = _sizes(seqlen_q, seqlen_k)
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads, headdim, dtype)
    run_checked(q, k, v, causal=causal, backend=backend)


# ---------------------------------------------------------------------------------------
# Grouped-query / multi-query attention.


def _per_backend(head_dims=None):
    """(backend, headdim, dtype) params, all compiled head dims or those in ``head_dims``."""
    cases = []
    for backend, (dims, dtypes) in SUPPORT.items():
        for headdim in dims:
            if head_dims is not None and headdim not in head_dims:
                continue
            for dtype in dtypes:
                cases.append(
                    pytest.param(backend, headdim, dtype, id=f"{backend}-hd{headdim}-{dtype}")
                )
    return cases


@pytest.mark.parametrize("backend, headdim, dtype", _per_backend())
@pytest.mark.parametrize("nheads, nheads_kv", [(8, 2), (6, 1)], ids=["gqa8to2", "mqa6to1"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(128, 333), (333, 128)], ids=["128x333", "333x128"])
def test_grouped_query(gen, backend, headdim, dtype, nheads, nheads_kv, causal, seqlen_q, seqlen_k):
    q, k, v = make_qkv(gen, 2, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype)
    # Allocating path (no out=): the result and lse come from torch.
    out, lse = flashcute.attention(q, k, v, causal=causal, return_lse=True, backend=backend)
    check_close(out, lse, q, k, v, causal=causal)


# ---------------------------------------------------------------------------------------
# Strided layouts.


@pytest.mark.parametrize("backend, headdim, dtype", _per_backend())
@pytest.mark.parametrize("layout", ["bhsd", "packed", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_strided_layouts(gen, backend, headdim, dtype, layout, causal):
    q, k, v = make_qkv(gen, 2, 200, 200, 4, 4, headdim, dtype, layout=layout)
    assert not q.is_contiguous()
    out, lse = flashcute.attention(q, k, v, causal=causal, return_lse=True, backend=backend)
    check_close(out, lse, q, k, v, causal=causal)


@pytest.mark.parametrize("backend, headdim, dtype", _per_backend(LONG_HEAD_DIMS))
def test_strided_out(gen, backend, headdim, dtype):
    """out in SDPA's layout: (batch, heads, seqlen, headdim) storage, transposed."""
    q, k, v = make_qkv(gen, 2, 150, 300, 4, 2, headdim, dtype, layout="bhsd")
    out = torch.full((2, 4, 150, headdim), math.nan, dtype=q.dtype, device="cuda")
    out = out.transpose(1, 2)
    result = flashcute.attention(q, k, v, causal=True, out=out, backend=backend)
    assert result is out
    check_close(result, None, q, k, v, causal=True)


# ---------------------------------------------------------------------------------------
# Arguments: out=, return_lse, softmax_scale, backend.


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_is_returned(gen, backend):
    head_dims, dtypes = SUPPORT[backend]
    q, k, v = make_qkv(gen, 2, 64, 64, 2, 2, head_dims[0], dtypes[0])
    out = poisoned_like(q)
    result = flashcute.attention(q, k, v, out=out, backend=backend)
    assert result is out
    check_close(out, None, q, k, v, causal=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_return_lse_shapes(gen, backend):
    head_dims, dtypes = SUPPORT[backend]
    q, k, v = make_qkv(gen, 3, 40, 70, 4, 2, head_dims[-1], dtypes[-1])
    result = flashcute.attention(q, k, v, return_lse=True, backend=backend)
    assert isinstance(result, tuple) and len(result) == 2
    out, lse = result
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert lse.shape == (3, 4, 40) and lse.dtype == torch.float32 and lse.device == q.device
    check_close(out, lse, q, k, v, causal=False)
    alone = flashcute.attention(q, k, v, backend=backend)
    assert isinstance(alone, torch.Tensor)


@pytest.mark.parametrize("backend, headdim, dtype", _per_backend(LONG_HEAD_DIMS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("softmax_scale", [0.3, 0.01])
def test_softmax_scale(gen, backend, headdim, dtype, causal, softmax_scale):
    q, k, v = make_qkv(gen, 2, 100, 257, 4, 4, headdim, dtype)
    run_checked(q, k, v, causal=causal, backend=backend, softmax_scale=softmax_scale)


@pytest.mark.parametrize("backend, headdim, dtype", _per_backend())
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("growth", [8.0, 40.0], ids=["x8", "x40"])
def test_scores_grow_toward_first_keys(gen, backend, headdim, dtype, causal, growth):
    """Keys scaled up toward key 0: the Hopper path visits key blocks from the last to the
    first, so each block's scores can far exceed every max seen before. Its shortcut that keeps
    a row's max (online_softmax.h) must then redo the block: at x8 the weights outgrow the
    shortcut's limit, at x40 exp2 against the kept max overflows."""
    q, k, v = make_qkv(gen, 1, 300, 1500, 2, 2, headdim, dtype)
    ramp = torch.linspace(growth, 1.0, k.shape[1], device="cuda", dtype=torch.float32)
    k = (k.float() * ramp[None, :, None, None]).to(k.dtype)
    run_checked(q, k, v, causal=causal, backend=backend)


def test_default_backend(gen):
    """backend=None picks the GPU's default backend and gives its exact results."""
    from flashcute import _C

    default = str(_C.default_backend(_capability()))
    head_dims, dtypes = SUPPORT.get(default, SUPPORT[BACKENDS[0]])
    headdim = 64 if 64 in head_dims else head_dims[0]
    q, k, v = make_qkv(gen, 2, 300, 300, 4, 4, headdim, dtypes[0])
    out, lse = flashcute.attention(q, k, v, causal=True, return_lse=True)
    check_close(out, lse, q, k, v, causal=True)
    if default in SUPPORT:
        named, named_lse = flashcute.attention(
            q, k, v, causal=True, return_lse=True, backend=default
        )
        assert torch.equal(out, named) and torch.equal(lse, named_lse)


def test_hopper_head_dims_and_fallback(gen):
    """Head dim 32: backend="hopper" runs it on its smallest kernel at least as large where it
    can run (refused with ValueError elsewhere); the default keeps the Ampere path's own hd 32
    kernel and gives exactly its results."""
    q, k, v = make_qkv(gen, 1, 40, 40, 2, 2, 32, "float16")
    hopper_dims, hopper_dtypes = SUPPORT.get("hopper", ([], []))
    if any(d >= 32 for d in hopper_dims) and "float16" in hopper_dtypes:
        run_checked(q, k, v, causal=True, backend="hopper")
    else:
        with pytest.raises(ValueError, match=r"(?i)hopper"):
            flashcute.attention(q, k, v, backend="hopper")
    if "hopper" not in SUPPORT or 32 not in SUPPORT.get("ampere", ([], []))[0]:
        return
    out, lse = flashcute.attention(q, k, v, causal=True, return_lse=True)
    check_close(out, lse, q, k, v, causal=True)
    ref_out, ref_lse = flashcute.attention(q, k, v, causal=True, return_lse=True, backend="ampere")
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


@pytest.mark.parametrize("backend, headdim, dtype", _per_backend())
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k",
                         [(3, 1500, 1700), (3, 1700, 1500), (2, 2100, 2100), (3, 1536, 1536)])
def test_many_tiles_per_cta(gen, backend, headdim, dtype, causal, batch, seqlen_q, seqlen_k):
    """More query tiles than SMs several times over: the persistent Hopper kernel reuses its
    Q/O buffers and pipeline phases across tiles (GQA, seqlen_q != seqlen_k, ragged tails).
    With causal masking it runs tiles in pairs; 2100 rows make an odd number of query blocks
    for 128- and 192-row tiles, so the unpaired middle blocks run too. Ragged tails move every
    head's last tile to the end of the order; 1536 rows fill 128- and 192-row tiles exactly."""
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, 12, 4, headdim, dtype)
    run_checked(q, k, v, causal=causal, backend=backend)


@pytest.mark.skipif(128 not in SUPPORT.get("hopper", ([], []))[0],
                    reason="no Hopper-path hd 128 kernel on this GPU")
@pytest.mark.parametrize("dtype", SUPPORT.get("hopper", ([], ALL_DTYPES))[1])
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, nheads, nheads_kv, causal",
                         [(2, 333, 8500, 4, 2, False), (1, 64, 8448, 3, 3, False),
                          (1, 700, 9000, 4, 2, True), (1, 200, 8300, 6, 1, True)])
def test_hd128_long_keys(gen, dtype, batch, seqlen_q, seqlen_k, nheads, nheads_kv, causal):
    """hd 128 with 8192 or more keys per row on average keeps its one tile (64-key blocks, three
    consumers): a masked key tail (8500, 8300) or none (8448 = 132 blocks), causal rows whose
    diagonal falls inside a block, GQA."""
    from flashcute._build_info import load_extension

    assert tuple(load_extension()._forward_tile(128, seqlen_q, seqlen_k, causal)) == (64, 3)
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, 128, dtype)
    run_checked(q, k, v, causal=causal, backend="hopper")


@pytest.mark.skipif(64 not in SUPPORT.get("hopper", ([], []))[0],
                    reason="no Hopper-path hd 64 kernel on this GPU")
@pytest.mark.parametrize("dtype", SUPPORT.get("hopper", ([], ALL_DTYPES))[1])
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, nheads, nheads_kv",
                         [(3, 1024, 1024, 6, 2), (2, 333, 600, 4, 4), (2, 1100, 333, 6, 3),
                          (1, 17, 300, 2, 1), (40, 129, 129, 3, 1)])
def test_short_causal_tile(gen, dtype, batch, seqlen_q, seqlen_k, nheads, nheads_kv):
    """Causal hd 64 whose rows see at most 512 keys on average runs 64-key blocks in four
    stages: exactly at the bound (1024 x 1024), a key tail inside a block (600, 333, 129),
    seqlen_q > seqlen_k (rows without keys), GQA, and many tiles per CTA (40 x 3 heads)."""
    from flashcute._build_info import load_extension

    assert tuple(load_extension()._forward_tile(64, seqlen_q, seqlen_k, True)) == (64, 3)
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, 64, dtype)
    run_checked(q, k, v, causal=True, backend="hopper")


@pytest.mark.parametrize("backend, headdim, dtype", _per_backend())
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(100, 100), (333, 1000), (1000, 333), (1100, 1100)])
def test_causal_partial_tile_keeps_guard_rows(gen, backend, headdim, dtype, seqlen_q, seqlen_k):
    """Causal query rows that do not fill whole tiles: the Hopper path starts its first tile
    before row 0 (so the partial tile is the one with the fewest keys). out lies inside a
    NaN-filled buffer with guard rows before and after every batch's rows; none may change."""
    batch, nheads, guard = 2, 3, 64
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads, headdim, dtype)
    storage = torch.full((batch, guard + seqlen_q + guard, nheads, headdim), math.nan,
                         dtype=q.dtype, device=q.device)
    out = storage[:, guard:guard + seqlen_q]
    result, lse = flashcute.attention(q, k, v, causal=True, out=out, return_lse=True, backend=backend)
    assert result is out
    assert torch.isnan(storage[:, :guard]).all(), "rows before out were written"
    assert torch.isnan(storage[:, guard + seqlen_q:]).all(), "rows after out were written"
    check_close(out, lse, q, k, v, causal=True)


# Shapes whose last wave of query tiles the Hopper path runs split: fewer tiles than SMs with
# long keys (every tile in pieces, partial query tiles, a masked key tail), two tiles of
# 114-250 key blocks (each in ceil(sqrt(blocks)) pieces), more full tiles than SMs, two
# decode-like shapes (1 and 17 query rows: warps without rows leave no state; few rows merge
# by chunks over all threads), and tiles of 128 and 2 rows (both merges in one call).
_SPLIT_SHAPES = [(1, 700, 5000, 6, 2), (1, 100, 20000, 2, 1), (2, 1536, 4000, 12, 4),
                 (1, 1, 30000, 8, 2), (3, 17, 9000, 4, 4), (1, 130, 9000, 2, 2)]


def _hopper_split_planned(batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype) -> bool:
    from flashcute._build_info import load_extension

    ext = load_extension()
    return ext.forward_workspace_size(batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype,
                                      False, ext.BACKEND_HOPPER, -1) > 0


_HOPPER = SUPPORT.get("hopper", ([], []))


@pytest.mark.parametrize("headdim, dtype", [(hd, dt) for hd in _HOPPER[0] for dt in _HOPPER[1]])
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, nheads, nheads_kv", _SPLIT_SHAPES)
def test_split_last_wave(gen, headdim, dtype, batch, seqlen_q, seqlen_k, nheads, nheads_kv):
    """Pieces of a tile leave fp32 partial results; the last to finish merges them (in a fixed
    order, so the result is bitwise reproducible) and stores O and LSE."""
    assert _hopper_split_planned(batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype)
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype)
    out, lse = run_checked(q, k, v, causal=False, backend="hopper")
    again, again_lse = flashcute.attention(q, k, v, return_lse=True, backend="hopper")
    assert torch.equal(out.view(torch.int16), again.view(torch.int16))
    assert torch.equal(lse.view(torch.int32), again_lse.view(torch.int32))


# Grouped-query calls with few query rows (batch, seqlen_q, seqlen_k, nheads, nheads_kv, causal):
# the Hopper path packs the query heads of a group into a tile's rows where the group size
# divides 64 (decoding, causal with one row, a long cache that is also split, 2 to 64 heads per
# group, packed rows over two or three tiles), and keeps groups it cannot pack (3 heads; causal
# with 7 rows) unpacked.
_PACKED_SHAPES = [(2, 1, 333, 8, 2, True), (1, 1, 30000, 32, 8, False), (3, 5, 1000, 16, 2, False),
                  (2, 17, 2049, 4, 2, False), (1, 1, 17, 64, 1, True), (2, 40, 700, 12, 3, False),
                  (1, 3, 5000, 6, 2, False), (2, 7, 4000, 32, 2, True), (2, 100, 700, 8, 2, False)]


@pytest.mark.parametrize("headdim, dtype", [(hd, dt) for hd in _HOPPER[0] for dt in _HOPPER[1]])
@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, nheads, nheads_kv, causal", _PACKED_SHAPES)
def test_packed_query_heads(gen, headdim, dtype, batch, seqlen_q, seqlen_k, nheads, nheads_kv, causal):
    """Row r of a packed tile is query row r / G of head h·G + r % G: Q is loaded, O stored and
    LSE written per (row, head), against float64, into a poisoned output."""
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype)
    run_checked(q, k, v, causal=causal, backend="hopper")
    # Strided q and out (bhsd: heads further apart than rows) take the same tensor maps.
    q_t, k_t, v_t = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim, dtype, layout="bhsd")
    run_checked(q_t, k_t, v_t, causal=causal, backend="hopper")


@pytest.mark.skipif(128 not in _HOPPER[0], reason="no Hopper-path hd 128 kernel on this GPU")
@pytest.mark.parametrize("shape", [(1, 700, 5000, 6, 2), (4, 1, 8192, 32, 8)], ids=["rows", "decoding"])
def test_split_last_wave_in_cuda_graph(gen, shape):
    """The split's workspace comes from the graph's pool and its counters are zeroed in every
    replay by a kernel that the forward kernel follows as its programmatic dependent, so every
    replay merges afresh (many-row merge, and packed query heads with the few-row merge)."""
    dtype = _HOPPER[1][-1]
    assert _hopper_split_planned(*shape, 128, dtype)
    q, k, v = make_qkv(gen, *shape, 128, dtype)
    static_q = q.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flashcute.attention(static_q, k, v, backend="hopper")  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_lse = flashcute.attention(static_q, k, v, return_lse=True, backend="hopper")
    for _ in range(2):
        fresh_q = make_qkv(gen, *shape, 128, dtype)[0]
        static_q.copy_(fresh_q)
        static_out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        check_close(static_out, static_lse, fresh_q, k, v, causal=False)


# ---------------------------------------------------------------------------------------
# Streams.


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_default_stream(gen, backend):
    """The kernel runs on the current stream: it must see inputs still being made there."""
    head_dims, dtypes = SUPPORT[backend]
    headdim = 128 if 128 in head_dims else head_dims[-1]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        # Hold the stream back so that a launch on any other stream would run before the
        # inputs and the NaN-filled out exist, and show as wrong or NaN results.
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is not None:
            sleep(50_000_000)
        q, k, v = make_qkv(gen, 2, 1000, 1000, 4, 2, headdim, dtypes[0])
        out = poisoned_like(q)
        result, lse = flashcute.attention(
            q, k, v, causal=True, return_lse=True, out=out, backend=backend
        )
    stream.synchronize()
    assert result is out
    check_close(result, lse, q, k, v, causal=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_direct_launch_on_side_stream_and_in_cuda_graph(gen, backend):
    """Torch tensors nothing watches skip the custom op: the direct launch must still use the
    current stream, match the custom op bitwise, and replay from a CUDA graph."""
    head_dims, dtypes = SUPPORT[backend]
    headdim = 128 if 128 in head_dims else head_dims[-1]
    q, k, v = make_qkv(gen, 2, 300, 333, 4, 2, headdim, dtypes[0])
    scale = 1.0 / math.sqrt(headdim)
    via_op = torch.ops.flashcute.attention_forward(q, k, v, True, scale, backend)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is not None:
            sleep(50_000_000)  # a launch on another stream would read q before this copy
        q_late = q.clone()
        direct = flashcute.attention(q_late, k, v, causal=True, return_lse=True, backend=backend)
    side.synchronize()
    assert torch.equal(direct[0], via_op[0]) and torch.equal(direct[1], via_op[1])

    static_q = q.clone()
    with torch.cuda.stream(side):
        flashcute.attention(static_q, k, v, causal=True, backend=backend)  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_lse = flashcute.attention(
            static_q, k, v, causal=True, return_lse=True, backend=backend
        )
    fresh_q = make_qkv(gen, 2, 300, 333, 4, 2, headdim, dtypes[0])[0]
    static_q.copy_(fresh_q)
    static_out.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    check_close(static_out, static_lse, fresh_q, k, v, causal=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_direct_route_rechecks_each_call_of_a_kept_signature(gen, backend):
    """The direct route keeps what its checks decided per call signature (shapes, strides,
    dtypes, devices, scalars): a repeated signature must compute from its own inputs, and a
    pointer that breaks 16-byte alignment under the same shapes and strides is still refused
    (q, or out=)."""
    head_dims, dtypes = SUPPORT[backend]
    headdim = 128 if 128 in head_dims else head_dims[-1]
    for _ in range(2):
        q, k, v = make_qkv(gen, 2, 17, 333, 4, 2, headdim, dtypes[0])
        out, lse = flashcute.attention(q, k, v, causal=True, return_lse=True, backend=backend)
        check_close(out, lse, q, k, v, causal=True)
    n = q.numel()
    flat = torch.randn(n + 8, generator=gen, device="cuda", dtype=q.dtype)
    aligned, shifted = flat[:n].view(q.shape), flat[1 : n + 1].view(q.shape)
    assert aligned.stride() == shifted.stride() == q.stride()
    check_close(flashcute.attention(aligned, k, v, causal=True, backend=backend), None,
                aligned, k, v, causal=True)
    with pytest.raises(ValueError, match="16-byte aligned"):
        flashcute.attention(shifted, k, v, causal=True, backend=backend)
    # The same with out=, which takes the direct route as well.
    given = poisoned_like(q)
    assert flashcute.attention(q, k, v, causal=True, out=given, backend=backend) is given
    check_close(given, None, q, k, v, causal=True)
    with pytest.raises(ValueError, match="16-byte aligned"):
        flashcute.attention(q, k, v, causal=True, out=flat[1 : n + 1].view(q.shape), backend=backend)


# ---------------------------------------------------------------------------------------
# Empty problems.


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("with_out", [False, True], ids=["alloc", "out"])
def test_no_keys(gen, backend, causal, with_out):
    head_dims, dtypes = SUPPORT[backend]
    q, k, v = make_qkv(gen, 2, 7, 0, 4, 2, head_dims[0], dtypes[0])
    out = poisoned_like(q) if with_out else None
    result, lse = flashcute.attention(
        q, k, v, causal=causal, return_lse=True, out=out, backend=backend
    )
    if with_out:
        assert result is out
    assert result.shape == q.shape and result.dtype == q.dtype
    assert (result == 0).all()
    assert lse.shape == (2, 4, 7) and lse.dtype == torch.float32
    assert torch.isneginf(lse).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_empty_problems_need_no_workspace(backend, causal):
    """The forward's workspace size for calls that launch nothing: 0, also with no heads at
    all (no K/V heads to divide by)."""
    ext = pytest.importorskip("flashcute._C")
    head_dims, dtypes = SUPPORT[backend]
    code = {"ampere": ext.BACKEND_AMPERE, "hopper": ext.BACKEND_HOPPER}[backend]
    for batch, seqlen_q, seqlen_k, nheads, nheads_kv in [
        (2, 0, 5, 4, 2), (0, 5, 5, 4, 2), (0, 0, 0, 4, 2), (2, 5, 5, 0, 0), (2, 5, 9000, 0, 0),
    ]:
        size = ext.forward_workspace_size(
            batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dims[-1], dtypes[0], causal, code, 0
        )
        assert size == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "batch, seqlen_q, seqlen_k, nheads, nheads_kv",
    [(2, 0, 5, 4, 2), (0, 5, 5, 4, 2), (0, 0, 0, 4, 2), (2, 5, 5, 0, 0)],
    ids=["seqlen_q0", "batch0", "all0", "heads0"],
)
def test_empty_output(gen, backend, batch, seqlen_q, seqlen_k, nheads, nheads_kv):
    head_dims, dtypes = SUPPORT[backend]
    q, k, v = make_qkv(gen, batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dims[0], dtypes[0])
    out, lse = flashcute.attention(q, k, v, causal=True, return_lse=True, backend=backend)
    assert out.shape == q.shape and out.numel() == 0 and out.dtype == q.dtype
    assert lse.shape == (batch, nheads, seqlen_q) and lse.dtype == torch.float32
    given = torch.empty_like(q)
    assert flashcute.attention(q, k, v, out=given, backend=backend) is given


# ---------------------------------------------------------------------------------------
# Determinism.


@pytest.mark.parametrize("backend, headdim, dtype", _per_backend(LONG_HEAD_DIMS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_deterministic(gen, backend, headdim, dtype, causal):
    q, k, v = make_qkv(gen, 2, 777, 1000, 4, 2, headdim, dtype)
    first, first_lse = flashcute.attention(q, k, v, causal=causal, return_lse=True, backend=backend)
    second, second_lse = flashcute.attention(
        q, k, v, causal=causal, return_lse=True, backend=backend
    )
    # Compare bits, so that even NaNs in identical places would count as different runs.
    assert torch.equal(first.view(torch.int16), second.view(torch.int16))
    assert torch.equal(first_lse.view(torch.int32), second_lse.view(torch.int32))


# ---------------------------------------------------------------------------------------
# Other frameworks.


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_out", [False, True], ids=["alloc", "out"])
def test_cupy_inputs(gen, backend, with_out):
    cupy = pytest.importorskip("cupy")
    head_dims, dtypes = SUPPORT[backend]
    if "float16" not in dtypes:
        pytest.skip("cupy has no bfloat16; float16 is not compiled for this backend")
    headdim = 64 if 64 in head_dims else head_dims[0]
    q, k, v = make_qkv(gen, 2, 150, 200, 4, 2, headdim, "float16")
    torch.cuda.synchronize()
    cq, ck, cv = (cupy.from_dlpack(x) for x in (q, k, v))
    cout = cupy.full(cq.shape, cupy.nan, dtype=cupy.float16) if with_out else None
    result, lse = flashcute.attention(
        cq, ck, cv, causal=True, return_lse=True, out=cout, backend=backend
    )
    cupy.cuda.get_current_stream().synchronize()
    assert isinstance(result, cupy.ndarray) and isinstance(lse, cupy.ndarray)
    if with_out:
        assert result is cout
    assert result.dtype == cupy.float16 and lse.dtype == cupy.float32
    check_close(torch.from_dlpack(result), torch.from_dlpack(lse), q, k, v, causal=True)


def _jax_gpu():
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with torch
    jax = pytest.importorskip("jax")
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        devices = []
    if not devices:
        pytest.skip("jax has no GPU device")
    return jax, devices[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_jax_inputs(gen, backend, dtype):
    jax, device = _jax_gpu()
    import jax.numpy as jnp
    import numpy as np

    head_dims, dtypes = SUPPORT[backend]
    if dtype not in dtypes:
        pytest.skip(f"{dtype} is not compiled for {backend}")
    headdim = 64 if 64 in head_dims else head_dims[0]
    q, k, v = make_qkv(gen, 2, 150, 200, 4, 2, headdim, dtype)

    def to_jax(x):
        # Through host memory: jax gets its own buffer on its own GPU device.
        host = x.cpu()
        if x.dtype == torch.bfloat16:
            array = host.view(torch.int16).numpy().view(jnp.bfloat16)
        else:
            array = host.numpy()
        return jax.device_put(array, device)

    jq, jk, jv = (to_jax(x) for x in (q, k, v))
    result, lse = flashcute.attention(jq, jk, jv, causal=True, return_lse=True, backend=backend)
    assert isinstance(result, jax.Array) and isinstance(lse, jax.Array)
    assert result.dtype == jq.dtype and result.shape == jq.shape
    out = torch.from_numpy(np.asarray(result).astype(np.float32)).to(q.device, q.dtype)
    lse = torch.from_numpy(np.asarray(lse)).to(q.device)
    check_close(out, lse, q, k, v, causal=True)
