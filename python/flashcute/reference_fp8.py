"""Exact float64 emulation of FP8 (e4m3) attention, the yardstick of FP8 kernels' accuracy.

Every rounding an FP8 forward makes is reproduced exactly in float64 and nothing else is: Q, K
and V rounded to e4m3 with their scales (per tensor, per (batch, head) or per block of
``FP8_BLOCK`` rows), optionally after a random-sign Hadamard transform of Q and K over the head
dim, and the softmax weights P rounded to e4m3 after scaling by ``P_SCALE``. Products and sums
are exact float64, so the emulation's error against float64 attention is the error that FP8
rounding alone causes; a kernel's own error is measured against it.

numpy only: usable on machines without a GPU or torch.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

#: Rows per quantization block of block-wise scales, for every head dim.
FP8_BLOCK = 128
#: The largest finite e4m3 value (e4m3fn: no infinities).
E4M3_MAX = 448.0
#: P = exp(s - rowmax) lies in (0, 1]; it is scaled by this power of two before rounding, so
#: its largest value uses e4m3's upper binades and the scale itself is exact.
P_SCALE = 256.0

Granularity = Literal["tensor", "head", "block"]


def round_e4m3(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to the nearest e4m3fn value (ties to even), saturated at +-448, as float64:
    3 mantissa bits, exponents 2^-6..2^8, subnormals in steps of 2^-9."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    _, exp = np.frexp(np.maximum(a, 2.0**-6))  # a = m * 2**exp, m in [0.5, 1)
    quantum = np.ldexp(1.0, exp - 4)  # 3 mantissa bits below the leading one
    rounded = np.round(a / quantum) * quantum  # numpy rounds half to even
    return np.copysign(np.minimum(rounded, E4M3_MAX), x)


def hadamard_signs(d: int, seed: int) -> np.ndarray:
    """The random signs (+-1.0, length ``d``) of the Hadamard transform keyed by ``seed``: sign
    j is the top bit of a 64-bit mix of (seed, j), so a kernel can draw the same ones."""
    mask = (1 << 64) - 1
    signs = np.empty(d)
    for j in range(d):
        h = (seed * 0x9E3779B97F4A7C15 + (j + 1) * 0xBF58476D1CE4E5B9) & mask
        h ^= h >> 31
        h = (h * 0x94D049BB133111EB) & mask
        h ^= h >> 29
        signs[j] = -1.0 if h >> 63 else 1.0
    return signs


def hadamard(x: np.ndarray, seed: int) -> np.ndarray:
    """``x @ diag(signs) @ H / sqrt(d)`` over the last (head) dim, H the Sylvester Hadamard
    matrix: orthonormal, so applying it to Q and K with one seed keeps Q K^T.

    Raises:
        ValueError: a head dim that is not a power of two.
    """
    d = x.shape[-1]
    if d < 1 or d & (d - 1):
        raise ValueError(f"x: the Hadamard transform needs a power-of-two head dim, got {d}")
    y = np.asarray(x, dtype=np.float64) * hadamard_signs(d, seed)
    h = 1
    while h < d:  # the fast Walsh-Hadamard transform, butterflies of width h
        y = y.reshape(*y.shape[:-1], d // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = np.stack((a + b, a - b), axis=-2).reshape(*x.shape)
        h *= 2
    return y / np.sqrt(d)


def quantize(x: np.ndarray, granularity: Granularity) -> tuple[np.ndarray, np.ndarray]:
    """(values on the e4m3 grid, descale) of a (batch, seqlen, heads, d) tensor: each group's
    amax maps to 448. The descale has the shape the kernels take: () per tensor,
    (batch, heads) per head, (batch, heads, ceil(seqlen / FP8_BLOCK)) per block; a group of
    zeros gets descale 1."""
    x = np.asarray(x, dtype=np.float64)
    b, s, h, d = x.shape
    if granularity == "tensor":
        amax = np.abs(x).max(initial=0.0)
        descale = np.asarray(amax / E4M3_MAX if amax > 0 else 1.0)
    elif granularity == "head":
        amax = np.abs(x).max(axis=(1, 3), initial=0.0)  # (b, h)
        descale = np.where(amax > 0, amax / E4M3_MAX, 1.0)
    elif granularity == "block":
        blocks = -(-s // FP8_BLOCK)
        padded = np.zeros((b, blocks * FP8_BLOCK, h, d))
        padded[:, :s] = x
        amax = np.abs(padded.reshape(b, blocks, FP8_BLOCK, h, d)).max(axis=(2, 4))  # (b, blocks, h)
        descale = np.where(amax > 0, amax / E4M3_MAX, 1.0).transpose(0, 2, 1)  # (b, h, blocks)
    else:
        raise ValueError(f"granularity: expected 'tensor', 'head' or 'block', got {granularity!r}")
    return round_e4m3(x / _row_descales(descale, b, s, h)[..., None]), descale


def _row_descales(descale: np.ndarray, b: int, s: int, h: int) -> np.ndarray:
    """A ``quantize`` descale spread to (b, s, h): the factor of each row."""
    if descale.ndim == 0:
        return np.full((b, s, h), float(descale))
    if descale.ndim == 2:
        return np.broadcast_to(descale[:, None, :], (b, s, h))
    return np.repeat(descale.transpose(0, 2, 1), FP8_BLOCK, axis=1)[:, :s]


def attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = False,
    softmax_scale: float | None = None,
) -> np.ndarray:
    """float64 attention of (batch, seqlen, heads, d) tensors, GQA and bottom-right causal."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    return _attend(q, k, v, np.ones(k.shape[:3]), np.ones(v.shape[:3]), causal, softmax_scale, None)


def _attend(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, k_rows: np.ndarray, v_rows: np.ndarray,
    causal: bool, softmax_scale: float | None, p_scale: float | None,
) -> np.ndarray:
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    group = h // hk
    k = np.repeat(k * k_rows[..., None], group, axis=2)
    v = np.repeat(v * v_rows[..., None], group, axis=2)
    scale = 1.0 / np.sqrt(d) if softmax_scale is None else softmax_scale
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        visible = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq
        s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    denom = p.sum(axis=-1, keepdims=True)
    if p_scale is not None:  # the weights the second GEMM sees; the row sums stay exact
        p = round_e4m3(p * p_scale) / p_scale
    out = np.einsum("bhqk,bkhd->bqhd", p, v) / np.where(denom > 0, denom, 1.0).transpose(0, 2, 1, 3)
    return out


def attention_fp8(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, granularity: Granularity = "head",
    hadamard_seed: int | None = None, causal: bool = False, softmax_scale: float | None = None,
    round_v: bool = True, round_p: bool = True,
) -> np.ndarray:
    """What an FP8 forward computes, with its roundings only: Q and K (Hadamard-rotated with
    ``hadamard_seed`` when given) and V quantized to e4m3 at ``granularity``, scores from the
    rounded values times their descales, P rounded to e4m3 after scaling by ``P_SCALE``.
    ``round_v`` / ``round_p`` False leave V / P exact: what each rounding adds to the error."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scale = 1.0 / np.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    if hadamard_seed is not None:
        q, k = hadamard(q, hadamard_seed), hadamard(k, hadamard_seed)
    (q8, qd), (k8, kd) = (quantize(x, granularity) for x in (q, k))
    b, sq, h, _ = q.shape
    sk, hk = k.shape[1], k.shape[2]
    if round_v:
        v8, vd = quantize(v, granularity)
        v_rows = _row_descales(vd, b, sk, hk)
    else:
        v8, v_rows = v, np.ones((b, sk, hk))
    q_rows = _row_descales(qd, b, sq, h)
    return _attend(q8 * q_rows[..., None], k8, v8, _row_descales(kd, b, sk, hk), v_rows, causal, scale,
                   P_SCALE if round_p else None)


def outlier_inputs(
    shape: tuple[int, ...], seed: int, fraction: float = 1e-3, magnitude: float = 10.0
) -> np.ndarray:
    """Standard normal values with ``fraction`` of the entries scaled by ``magnitude``: the
    inputs of the FlashAttention-3 paper's FP8 accuracy study."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    outliers = rng.random(shape) < fraction
    return np.where(outliers, x * magnitude, x)


def errors(actual: np.ndarray, expected: np.ndarray) -> dict[str, float]:
    """RMSE, cosine similarity and relative L1 of ``actual`` against ``expected``."""
    a = np.asarray(actual, dtype=np.float64).ravel()
    e = np.asarray(expected, dtype=np.float64).ravel()
    return {
        "rmse": float(np.sqrt(np.mean((a - e) ** 2))),
        "cosine": float(a @ e / (np.linalg.norm(a) * np.linalg.norm(e))),
        "rel_l1": float(np.abs(a - e).sum() / np.abs(e).sum()),
    }
