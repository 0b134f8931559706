"""``flashcute.quantize_fp8`` on a GPU against the float64 reference (``flashcute.reference_fp8``:
``quantize`` at granularity "head" or "block", after ``hadamard`` with the same seed).

Accuracy rule: without the Hadamard transform, the descales equal the reference's rounded to
float32, and every e4m3 byte is ``round_e4m3(x / descale)`` for the float32 descale returned
(computed here in float64, which is exact for this: a quotient of a 16-bit value by a
float32 is either an e4m3 rounding midpoint or at least 2^-29 (relative) away from one). The
kernel divides by that descale, so that ``x_fp8 * descale`` is the nearest e4m3 multiple of the
scale actually stored; it rounds the fp32 quotient to odd so that its e4m3 rounding is that of
the exact quotient, ties included. (The reference's own bytes divide by the float64 descale and
can differ at exact ties.) With the transform, the kernel's fp32 butterflies differ from float64
by a few fp32 ulps: descales agree to 2e-6 (relative), and a byte may differ only within 1e-5 of
a boundary, for at most 0.1% of the elements.

Inputs are fresh random data with per-head magnitudes from 2^-8 to 2^7 and 0.1% outliers (x20);
outputs and descales start poisoned (0x7F: e4m3fn NaN; NaN), the workspace with garbage.
Skipped without a GPU or without a build whose binding has ``quantize_fp8``.
"""

from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import flashcute  # noqa: E402
from flashcute import reference_fp8  # noqa: E402
from flashcute.quantize import quantize_extension  # noqa: E402

DEVICE = "cuda"
FP8_BLOCK = reference_fp8.FP8_BLOCK
DTYPES = [torch.float16, torch.bfloat16]


def _has_quantize() -> bool:
    try:
        from flashcute import _C
    except ImportError:
        return False
    return hasattr(_C, "quantize_fp8")


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _has_quantize(), reason="this build of flashcute._C has no quantize_fp8"),
]


@pytest.fixture
def gen(request):
    """A CUDA generator seeded from the test id: fresh but reproducible inputs per test."""
    return torch.Generator(device=DEVICE).manual_seed(zlib.crc32(request.node.nodeid.encode()))


def make_x(gen, shape, dtype, layout="contiguous"):
    """(batch, seqlen, heads, headdim) data in memory of `layout`: contiguous, "heads" (a slice
    of a tensor with more heads), "bhsd" ((b, h, s, d) memory, transposed) or "rows" (a slice of
    the batch and of 3 times the heads); memory outside the slice holds NaN."""
    b, s, h, d = shape
    values = torch.randn(shape, generator=gen, device=DEVICE)
    scale = torch.exp2(torch.randint(-8, 8, (1, 1, h, 1), generator=gen, device=DEVICE).float())
    outliers = torch.rand(shape, generator=gen, device=DEVICE) < 1e-3
    values.mul_(torch.where(outliers, scale * 20, scale))
    nan = float("nan")
    if layout == "contiguous":
        x = torch.empty(shape, dtype=dtype, device=DEVICE)
    elif layout == "heads":
        x = torch.full((b, s, h + 3, d), nan, dtype=dtype, device=DEVICE)[:, :, 2:2 + h]
    elif layout == "bhsd":
        x = torch.empty(b, h, s, d, dtype=dtype, device=DEVICE).transpose(1, 2)
    elif layout == "rows":
        x = torch.full((b + 1, s, 3 * h, d), nan, dtype=dtype, device=DEVICE)[1:, :, :h]
    else:
        raise ValueError(layout)
    return x.copy_(values)


def quantize_poisoned(x, block, hadamard, seed):
    """The binding called directly on poisoned outputs and a garbage workspace."""
    ext = quantize_extension()
    b, s, h, d = x.shape
    out = torch.full((b, s, h, d), 0x7F, dtype=torch.uint8, device=x.device)
    shape = (b, h, -(-s // FP8_BLOCK)) if block else (b, h)
    descale = torch.full(shape, float("nan"), dtype=torch.float32, device=x.device)
    nbytes = ext.quantize_fp8_workspace_size(b, h, block)
    workspace = torch.full((nbytes,), 0xAB, dtype=torch.uint8, device=x.device) if nbytes else None
    stream = torch.cuda.current_stream(x.device).cuda_stream
    ext.quantize_fp8(x, out, descale, workspace, block, hadamard, seed, stream)
    return out.view(torch.float8_e4m3fn), descale


def _row_scales(descale, s):
    """A reference descale spread over (b, s, h, 1)."""
    if descale.ndim == 2:
        return descale[:, None, :, None]
    return np.repeat(descale.transpose(0, 2, 1), FP8_BLOCK, axis=1)[:, :s, :, None]


def check(x, x_fp8, descale, *, block, hadamard, seed=0):
    y = x.double().cpu().numpy()
    if hadamard:
        y = reference_fp8.hadamard(y, seed)
    values, expected_descale = reference_fp8.quantize(y, "block" if block else "head")
    expected_descale = np.asarray(expected_descale)
    assert x_fp8.dtype == torch.float8_e4m3fn and x_fp8.is_contiguous() and x_fp8.shape == x.shape
    assert descale.dtype == torch.float32 and descale.shape == expected_descale.shape
    got_descale = descale.cpu().double().numpy()
    got_bytes = x_fp8.view(torch.uint8).cpu()
    if not hadamard:
        np.testing.assert_array_equal(got_descale, expected_descale.astype(np.float32))
        # x / the float32 descale, rounded once to e4m3 (see the module docstring)
        descale32 = expected_descale.astype(np.float32).astype(np.float64)
        expected = reference_fp8.round_e4m3(y / _row_scales(descale32, x.shape[1]))
        expected_bytes = torch.from_numpy(expected).float().to(torch.float8_e4m3fn).view(torch.uint8)
        mismatch = (got_bytes != expected_bytes).numpy()
        assert not mismatch.any(), (
            f"{mismatch.sum()} of {mismatch.size} bytes differ, first at "
            f"{np.argwhere(mismatch)[0].tolist()}"
        )
        return
    np.testing.assert_allclose(got_descale, expected_descale, rtol=2e-6, atol=0)
    # fp32 butterflies against float64: only near rounding boundaries, one neighbour of the
    # reference's rounding.
    expected_bytes = torch.from_numpy(values).float().to(torch.float8_e4m3fn).view(torch.uint8)
    mismatch = (got_bytes != expected_bytes).numpy()
    near, most = 1e-5, 1e-3
    assert mismatch.mean() <= most, f"{mismatch.sum()} of {mismatch.size} bytes differ"
    if mismatch.any():
        t = (y / _row_scales(expected_descale, x.shape[1]))[mismatch]
        got = x_fp8.float().cpu().numpy()[mismatch]
        low, high = reference_fp8.round_e4m3(t * (1 - near)), reference_fp8.round_e4m3(t * (1 + near))
        far = (got != low) & (got != high)
        assert not far.any(), f"values {got[far][:5]} for unrounded {t[far][:5]}"


# ---------------------------------------------------------------------------------------------
# Exact quantization, per head and per block


SHAPES = [(1, 1, 1, 64), (2, 127, 3, 128), (1, 129, 2, 64), (2, 1000, 4, 128), (1, 257, 2, 256),
          (3, 200, 5, 32)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("block", [False, True], ids=["head", "block"])
def test_matches_reference(gen, shape, dtype, block):
    x = make_x(gen, shape, dtype)
    check(x, *quantize_poisoned(x, block, False, 0), block=block, hadamard=False)


@pytest.mark.parametrize("headdim", [8, 16, 24, 40, 72, 96, 136, 200, 248])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("block", [False, True], ids=["head", "block"])
def test_head_dims(gen, headdim, dtype, block):
    x = make_x(gen, (2, 130, 3, headdim), dtype)
    check(x, *quantize_poisoned(x, block, False, 0), block=block, hadamard=False)


@pytest.mark.parametrize("layout", ["heads", "bhsd", "rows"])
@pytest.mark.parametrize("block", [False, True], ids=["head", "block"])
@pytest.mark.parametrize("hadamard", [False, True], ids=["plain", "hadamard"])
def test_strided_inputs(gen, layout, block, hadamard):
    x = make_x(gen, (2, 300, 3, 128), torch.bfloat16, layout)
    assert not x.is_contiguous()
    check(x, *quantize_poisoned(x, block, hadamard, 7), block=block, hadamard=hadamard, seed=7)


@pytest.mark.parametrize("block", [False, True], ids=["head", "block"])
@pytest.mark.parametrize("hadamard", [False, True], ids=["plain", "hadamard"])
def test_zero_groups_get_descale_one(gen, block, hadamard):
    x = make_x(gen, (2, 300, 3, 64), torch.float16)
    x[1, :, 2] = 0  # a whole head
    x[0, 128:256, 1] = 0  # one block of a head
    x[0, 256:, 0] = 0  # the partial last block of a head
    x_fp8, descale = quantize_poisoned(x, block, hadamard, 3)
    check(x, x_fp8, descale, block=block, hadamard=hadamard, seed=3)
    assert torch.all(descale[1, 2] == 1) and torch.all(x_fp8[1, :, 2].view(torch.uint8) == 0)
    if block:
        assert descale[0, 1, 1] == 1 and descale[0, 0, 2] == 1


def test_exact_ties_round_to_even():
    """Values at exact midpoints between e4m3 neighbours: amax 28 gives descale 1/16 exactly,
    so x * 16 lands on k / 4 in [4, 8) (steps of 1/2) and on k * 2^-10 in the subnormals (steps
    of 2^-9), k odd; each must round to the even neighbour, as the reference does."""
    odd = torch.arange(17, 32, 2, dtype=torch.float32)  # 17, 19, ..., 31
    row = torch.zeros(64)
    row[0] = 28.0
    row[1:9] = odd / 4 / 16
    row[9:17] = -odd[:8] / 4 / 16
    row[17:25] = torch.arange(1, 16, 2, dtype=torch.float32) * 2.0**-10 / 16
    x = row.expand(2, 3, 1, 64).contiguous().to(DEVICE, torch.bfloat16)
    assert torch.equal(x[0, 0, 0].float().cpu(), row)  # every value exact in bfloat16
    for block in (False, True):
        check(x, *quantize_poisoned(x, block, False, 0), block=block, hadamard=False)


def _near_midpoint_heads(dtype, heads):
    """Per head: an amax A whose descale A / 448 is not a float32, and values x of `dtype` with
    x / float64(A / 448) an e4m3 midpoint (a tie for the float64 descale) where x divided by the
    float32 descale is not a tie, but its correctly rounded fp32 quotient is one."""
    found = []
    for k in range(1, 4000):
        amax = float(torch.tensor(k / 64.0, dtype=dtype))
        descale32 = float(np.float32(amax / 448.0))
        if descale32 == amax / 448.0:
            continue
        xs = set()
        for e in range(-6, 9):  # midpoints with 21/16 (3 * 7) or 7 * 2^-10 in them
            for midpoint in (21 / 16 * 2.0**e, 7 * 2.0**-10):
                x = midpoint * amax / 448.0
                if x > amax or float(torch.tensor(x, dtype=dtype)) != x:
                    continue
                t = x / descale32
                if reference_fp8.round_e4m3(float(np.float32(t))) != reference_fp8.round_e4m3(t):
                    xs.add(x)
        if xs:
            assert len(xs) <= 64
            found.append((amax, sorted(xs)))
        if len(found) == heads:
            return found
    raise AssertionError("too few cases")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("block", [False, True], ids=["head", "block"])
def test_quotients_near_midpoints(dtype, block):
    """Quotients a hair off an e4m3 midpoint, whose fp32 rounding lands on it: each byte must be
    the e4m3 rounding of the exact quotient, not of the midpoint (ties to even)."""
    heads = _near_midpoint_heads(dtype, 32)
    x = torch.zeros(1, 3, len(heads), 64, dtype=torch.float64)
    for h, (amax, xs) in enumerate(heads):
        x[0, 0, h, 0] = amax
        x[0, 1, h, :len(xs)] = torch.tensor(xs, dtype=torch.float64)
        x[0, 2, h, :len(xs)] = -torch.tensor(xs, dtype=torch.float64)
    x = x.to(DEVICE, dtype)
    check(x, *quantize_poisoned(x, block, False, 0), block=block, hadamard=False)


# ---------------------------------------------------------------------------------------------
# The Hadamard transform


@pytest.mark.parametrize("headdim", [64, 128, 256])
@pytest.mark.parametrize("seed", [0, 1, 0xDEADBEEF, 2**64 - 1], ids=["0", "1", "deadbeef", "max"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block", [False, True], ids=["head", "block"])
def test_hadamard_matches_reference(gen, headdim, seed, dtype, block):
    x = make_x(gen, (2, 300, 3, headdim), dtype)
    check(x, *quantize_poisoned(x, block, True, seed), block=block, hadamard=True, seed=seed)


def test_hadamard_keeps_scores(gen):
    """Q and K rotated with one seed: the dequantized scores match Q K^T to FP8 precision;
    another seed for K does not."""
    q = make_x(gen, (1, 256, 2, 128), torch.bfloat16)
    k = make_x(gen, (1, 256, 2, 128), torch.bfloat16)

    def dequantized(x, seed):
        x_fp8, descale = flashcute.quantize_fp8(x, hadamard=True, seed=seed)
        return x_fp8.float() * descale[:, None, :, None]

    exact = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float())
    same = torch.einsum("bqhd,bkhd->bhqk", dequantized(q, 5), dequantized(k, 5))
    other = torch.einsum("bqhd,bkhd->bhqk", dequantized(q, 5), dequantized(k, 6))
    assert torch.nn.functional.cosine_similarity(same.flatten(), exact.flatten(), dim=0) > 0.995
    assert torch.nn.functional.cosine_similarity(other.flatten(), exact.flatten(), dim=0) < 0.5


# ---------------------------------------------------------------------------------------------
# Grids: several heads per step of the persistent grid, heads longer than the rings hold


@pytest.mark.parametrize("hadamard", [False, True], ids=["plain", "hadamard"])
def test_several_tiles_per_cta(gen, hadamard):
    """Block scales with more tiles than CTAs fit on a GPU of up to ~250 SMs: rings refilled."""
    x = make_x(gen, (2, 4096, 8, 128), torch.bfloat16)
    check(x, *quantize_poisoned(x, True, hadamard, 4), block=True, hadamard=hadamard, seed=4)


@pytest.mark.parametrize("shape", [(2, 2048, 160, 64), (2, 1400, 48, 128)], ids=["hd64", "hd128-ragged"])
def test_several_steps_of_teams(gen, shape):
    """Per-head scales with more heads than teams fit at once, chunks of several tiles, and a
    last chunk (and tile) shorter than the others."""
    x = make_x(gen, shape, torch.bfloat16)
    check(x, *quantize_poisoned(x, False, False, 0), block=False, hadamard=False)


@pytest.mark.parametrize("shape,dtype,hadamard", [
    ((1, 40000, 1, 128), torch.bfloat16, False),
    ((1, 20000, 2, 256), torch.float16, True),
    ((1, 100000, 1, 128), torch.bfloat16, False),
    ((1, 200000, 1, 64), torch.float16, False),
    ((1, 40000, 1, 256), torch.float16, True),
    ((1, 100000, 1, 128), torch.bfloat16, True),
], ids=["bf16-128-held", "fp16-256-hadamard-held", "bf16-128", "fp16-64", "fp16-256-hadamard",
        "bf16-128-hadamard"])
def test_heads_longer_than_the_grid(gen, shape, dtype, hadamard):
    """Heads of many tiles per CTA: held in the ring in chunks (the first two), or, beyond
    what the rings hold on a GPU of up to ~150 SMs, the re-reading kernel."""
    x = make_x(gen, shape, dtype)
    check(x, *quantize_poisoned(x, False, hadamard, 9), block=False, hadamard=hadamard, seed=9)


# ---------------------------------------------------------------------------------------------
# The public function


@pytest.mark.parametrize("block", [False, True], ids=["head", "block"])
@pytest.mark.parametrize("hadamard", [False, True], ids=["plain", "hadamard"])
def test_public_function(gen, block, hadamard):
    x = make_x(gen, (2, 333, 4, 128), torch.bfloat16, "heads")
    x_fp8, descale = flashcute.quantize_fp8(x, block=block, hadamard=hadamard, seed=42)
    assert x_fp8.device == x.device and descale.device == x.device
    check(x, x_fp8, descale, block=block, hadamard=hadamard, seed=42)


def test_runs_on_the_current_stream(gen):
    x = make_x(gen, (2, 1000, 4, 128), torch.float16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x_fp8, descale = flashcute.quantize_fp8(x)
    torch.cuda.current_stream().wait_stream(side)
    check(x, x_fp8, descale, block=False, hadamard=False)


def test_empty_inputs(gen):
    x = torch.zeros(2, 0, 3, 64, device=DEVICE, dtype=torch.bfloat16)
    x_fp8, descale = flashcute.quantize_fp8(x)
    assert x_fp8.shape == (2, 0, 3, 64) and torch.equal(descale.cpu(), torch.ones(2, 3))
    x_fp8, descale = flashcute.quantize_fp8(x, block=True)
    assert descale.shape == (2, 3, 0)


def test_repeated_calls_reuse_nothing_stale(gen):
    """The workspace is zeroed per call: back-to-back per-head calls of different data."""
    for scale in (1.0, 1e-3, 1e3):
        x = make_x(gen, (1, 500, 2, 64), torch.bfloat16) * scale
        check(x, *flashcute.quantize_fp8(x), block=False, hadamard=False)
