"""The byte rules of ``quantize_fp8``'s kernel without the Hadamard transform, modelled in numpy.

The kernel brackets x / descale by the products of x with the float32 neighbours
``inv * (1 -+ 2^-20)`` of the descale's reciprocal, each rounded to float32 and then to e4m3.
Here: wherever the two bytes agree, they equal the e4m3 rounding of x / descale (float64, exact
for a 16-bit x and a float32 descale: see test_gpu_quantize_fp8.py), for a reciprocal correctly
rounded and one ulp either side of it (the kernel's is within an ulp). For fp32 x the kernel
takes the exact quotient where they differ. For 16-bit x it computes one product only, chosen by
the side of amax / 448 on which the float descale lies (``Divisor::side``), and both where the
descale is exact (then the even byte): that rule is checked to give the exact rounding on
every value. Inputs: random 16-bit values, and values whose quotients lie next to e4m3 rounding
midpoints.
"""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy")

from flashcute import reference_fp8 as r  # noqa: E402

BRACKET = 2.0**-20  # cpp/quantize_fp8.h, quantize_store


def to_bfloat16(x: np.ndarray) -> np.ndarray:
    """x rounded toward zero to bfloat16, as float32 (exact)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def reciprocals(descale: np.float32) -> list[np.float32]:
    inv = np.float32(1.0 / float(descale))
    return [np.nextafter(inv, np.float32(0)), inv, np.nextafter(inv, np.float32(np.inf))]


def bracket_bytes(x: np.ndarray, inv: np.float32, bracket: float = BRACKET) -> tuple[np.ndarray, np.ndarray]:
    below = np.float32(inv * np.float32(1.0 - bracket))
    above = np.float32(inv * np.float32(1.0 + bracket))
    return r.round_e4m3((x * below).astype(np.float64)), r.round_e4m3((x * above).astype(np.float64))


def exact_bytes(x: np.ndarray, descale: np.float32) -> np.ndarray:
    return r.round_e4m3(x.astype(np.float64) / np.float64(descale))


def descale_of(amax: float) -> np.float32:
    return np.float32(amax / r.E4M3_MAX)


def near_midpoints(descale: np.float32, to16) -> np.ndarray:
    """16-bit values whose quotients by descale lie at or next to every e4m3 midpoint."""
    values = np.unique(np.abs(r.round_e4m3(np.linspace(-448, 448, 100_001))))
    mids = (values[:-1] + values[1:]) / 2
    targets = (mids * np.float64(descale)).astype(np.float32)
    base = to16(targets)
    step = np.abs(np.spacing(base)) * (65536 if to16 is to_bfloat16 else 8192)
    out = np.concatenate([base + k * step for k in range(-2, 3)]).astype(np.float32)
    out = to16(out)
    return np.concatenate([out, -out])


def to_float16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def midpoint_distance(q: np.ndarray) -> np.ndarray:
    """|q - the nearest e4m3 rounding midpoint| / |q|."""
    values = np.unique(np.abs(r.round_e4m3(np.linspace(-448, 448, 100_001))))
    mids = (values[:-1] + values[1:]) / 2
    a = np.abs(q)
    i = np.clip(np.searchsorted(mids, a), 1, mids.size - 1)
    return np.minimum(np.abs(a - mids[i - 1]), np.abs(a - mids[i])) / np.maximum(a, 2.0**-12)


@pytest.mark.parametrize("to16", [to_bfloat16, to_float16], ids=["bfloat16", "float16"])
def test_agreeing_products_are_the_exact_rounding(to16):
    """Agreeing bytes are exact; disagreeing ones are all quotients next to a midpoint. With
    amax itself a 16-bit value, as in the kernel, 448 * x / amax is often a midpoint exactly
    (amax 4.5 and x 1.6875: 168), which the descale's float32 rounding moves by under 2^-24: the
    fallback is data-dependent (no value for half of the amax between 3.5 and 5, up to 6 % of
    normal values for amax 3.5)."""
    rng = np.random.default_rng(20261128)
    disagree = 0
    for trial in range(48):
        x = to16(rng.standard_normal(4096) * 2.0 ** rng.uniform(-8, 7))
        x[rng.random(4096) < 0.001] *= 20
        amax = float(np.abs(x).max())
        if trial % 2:  # a maximum from elsewhere in the head, not one of these values
            amax *= 1 + rng.random() * 0.5
        descale = descale_of(amax)
        xs = np.concatenate([x, near_midpoints(descale, to16)]) if trial % 4 == 0 else x
        xs = xs[np.abs(xs) <= amax]
        exact = exact_bytes(xs, descale)
        for inv in reciprocals(descale):
            lo, hi = bracket_bytes(xs, inv)
            agree = lo == hi
            np.testing.assert_array_equal(lo[agree], exact[agree])
            q = xs[~agree].astype(np.float64) / np.float64(descale)
            assert (midpoint_distance(q) <= 2.0**-19).all()
            disagree += int((~agree).sum())
    assert disagree > 0


def test_a_bracket_inside_the_reciprocals_error_is_caught():
    """The margin matters: products by neighbours closer than the reciprocal's own error agree on
    wrong bytes next to midpoints, and this model sees it."""
    wrong = 0
    for amax in to_bfloat16(np.arange(3.5, 5.0, 1 / 32)):
        descale = descale_of(float(amax))
        xs = to_bfloat16(np.random.default_rng(3).standard_normal(4096))
        xs = xs[np.abs(xs) <= amax]
        exact = exact_bytes(xs, descale)
        for inv in reciprocals(descale):
            lo, hi = bracket_bytes(xs, inv, bracket=2.0**-26)
            wrong += int(((lo == hi) & (lo != exact)).sum())
    assert wrong > 0


def directed_bytes(x: np.ndarray, amax: float, descale: np.float32, inv: np.float32) -> np.ndarray:
    """The 16-bit rule: below's byte where the descale lies above amax / 448, above's where it
    lies below, and the even one of the two where it is exact."""
    lo, hi = bracket_bytes(x, inv)
    off = float(descale) * r.E4M3_MAX - amax  # exact in float64: 24-bit descale times 448
    if off > 0:
        return lo
    if off < 0:
        return hi
    return np.where(_odd_code(lo), hi, lo)


def _odd_code(v: np.ndarray) -> np.ndarray:
    """Whether the e4m3 code of each value (float64, exact e4m3 values) is odd."""
    a = np.abs(v)
    sub = a < 2.0**-6
    mant, exp = np.frexp(np.where(sub, 1.0, a))  # a = mant · 2^exp, mant in [0.5, 1)
    normal_odd = (np.round(mant * 16) % 2) == 1  # 1.mmm · 2^(exp - 1): the last of 3 bits
    sub_odd = (np.round(a * 512) % 2) == 1
    return np.where(sub, sub_odd, normal_odd)


def maxima(to16) -> np.ndarray:
    """16-bit maxima around 4 (the benchmark's normal inputs), those whose descale is exact
    (significands divisible by 7), and a spread of magnitudes."""
    rng = np.random.default_rng(7)
    near = to16(np.linspace(3.5, 5.0, 97))
    exact = to16(np.array([3.5, 28.0, 4.375, 5.25, 448.0, 0.21875, 7.0 * 2.0**-12]))
    spread = to16(2.0 ** rng.uniform(-20, 12, 64))
    return np.unique(np.concatenate([near, exact, spread]))


@pytest.mark.parametrize("to16", [to_bfloat16, to_float16], ids=["bfloat16", "float16"])
def test_directed_product_is_the_exact_rounding(to16):
    """One product by the side's bracket neighbour gives the exact byte of every 16-bit value,
    midpoints and exact descales included; the other side's product does not."""
    rng = np.random.default_rng(20261128)
    exact_descales = wrong_side = 0
    for amax in maxima(to16):
        amax = float(amax)
        descale = descale_of(amax)
        if descale == 0 or not np.isfinite(descale):
            continue
        exact_descales += float(descale) * r.E4M3_MAX == amax
        x = to16(rng.standard_normal(2048) * amax / 4)
        xs = np.concatenate([x, near_midpoints(descale, to16), [amax, -amax]])
        xs = xs[np.abs(xs) <= amax]
        exact = exact_bytes(xs, descale)
        for inv in reciprocals(descale):
            np.testing.assert_array_equal(directed_bytes(xs, amax, descale, inv), exact)
            lo, hi = bracket_bytes(xs, inv)
            off = float(descale) * r.E4M3_MAX - amax
            if off != 0:
                wrong_side += int(((hi if off > 0 else lo) != exact).sum())
    assert exact_descales >= 5
    assert wrong_side > 0
