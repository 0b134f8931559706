"""The float64 emulation of FP8 attention (flashcute.reference_fp8): e4m3 rounding against its
definition and torch's float8_e4m3fn, the Hadamard transform, the scales' shapes, and the error
order of the quantization modes on the FP8 paper's outlier inputs."""

from __future__ import annotations

import itertools
import math

import pytest

np = pytest.importorskip("numpy")

from flashcute import reference_fp8 as r  # noqa: E402


def e4m3_values() -> np.ndarray:
    """Every finite e4m3fn value, decoded from its bits (NaN: exponent and mantissa all ones)."""
    values = []
    for sign, exponent, mantissa in itertools.product((1, -1), range(16), range(8)):
        if exponent == 15 and mantissa == 7:
            continue
        if exponent == 0:
            values.append(sign * mantissa / 8 * 2.0**-6)
        else:
            values.append(sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return np.unique(np.array(values))


def test_e4m3_values_round_to_themselves():
    values = e4m3_values()
    assert values.max() == r.E4M3_MAX and values[values > 0].min() == 2.0**-9
    np.testing.assert_array_equal(r.round_e4m3(values), values)


def test_rounding_is_to_nearest_ties_to_even_and_saturates():
    values = e4m3_values()
    positive = values[values >= 0]
    mids = (positive[:-1] + positive[1:]) / 2
    rounded = r.round_e4m3(mids)
    # A midpoint goes to the neighbour whose last mantissa bit is 0.
    lower, upper = positive[:-1], positive[1:]
    even_lower = np.array([_mantissa_even(x) for x in lower])
    np.testing.assert_array_equal(rounded, np.where(even_lower, lower, upper))
    np.testing.assert_array_equal(r.round_e4m3(mids * (1 - 1e-9)), lower)
    np.testing.assert_array_equal(r.round_e4m3(mids * (1 + 1e-9)), upper)
    np.testing.assert_array_equal(r.round_e4m3([460.0, 1e9, -1e9]), [448.0, 448.0, -448.0])
    assert math.copysign(1.0, r.round_e4m3(np.array([-1e-12]))[0]) == -1.0


def _mantissa_even(x: float) -> bool:
    if x < 2.0**-6:
        return round(x / 2.0**-9) % 2 == 0
    exponent = math.floor(math.log2(x))
    return round(x / 2.0 ** (exponent - 3)) % 2 == 0


def test_rounding_matches_torch_float8():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("torch without float8_e4m3fn")
    x = np.random.default_rng(0).standard_normal(100_000) * np.exp2(
        np.random.default_rng(1).uniform(-12, 8.7, 100_000))
    x = np.clip(x, -r.E4M3_MAX, r.E4M3_MAX)
    theirs = torch.from_numpy(x).to(torch.float8_e4m3fn).to(torch.float64).numpy()
    np.testing.assert_array_equal(r.round_e4m3(x), theirs)


def test_hadamard_is_orthonormal_and_keeps_scores():
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((2, 2, 5, 3, 64))
    hq, hk = r.hadamard(q, 11), r.hadamard(k, 11)
    np.testing.assert_allclose((hq**2).sum(-1), (q**2).sum(-1), rtol=1e-12)
    np.testing.assert_allclose(np.einsum("bqhd,bkhd->bhqk", hq, hk),
                               np.einsum("bqhd,bkhd->bhqk", q, k), atol=1e-12)
    assert not np.allclose(r.hadamard(q, 12), hq)  # the seed picks the signs
    signs = r.hadamard_signs(256, 11)
    assert set(np.unique(signs)) == {-1.0, 1.0} and 80 < (signs > 0).sum() < 176
    with pytest.raises(ValueError, match="^x: .*power-of-two head dim, got 96"):
        r.hadamard(rng.standard_normal((1, 1, 1, 96)), 0)


@pytest.mark.parametrize("granularity, shape", [
    ("tensor", ()), ("head", (2, 3)), ("block", (2, 3, 3)),
])
def test_quantize_scales(granularity, shape):
    x = r.outlier_inputs((2, 300, 3, 64), seed=3)
    x[1, :, 2] = 0.0  # an all-zero head: descale 1
    values, descale = r.quantize(x, granularity)
    assert descale.shape == shape
    assert np.abs(values).max() == r.E4M3_MAX
    np.testing.assert_array_equal(r.round_e4m3(values), values)
    rows = r._row_descales(descale, 2, 300, 3)
    # Each value is within half an e4m3 step (relative 2^-4, or 2^-10 absolute) of x / descale.
    err = np.abs(values - x / rows[..., None])
    assert (err <= np.maximum(np.abs(x / rows[..., None]) * 2.0**-4, 2.0**-10) + 1e-12).all()
    if granularity != "tensor":
        assert (descale[1, 2] == 1.0).all()


def test_fp8_error_order_on_outlier_inputs():
    """The Hadamard transform with per-block scales beats plain FP8 at either granularity (with
    outliers in every block, per-block scales alone gain little)."""
    q, k, v = (r.outlier_inputs((1, 512, 2, 64), seed=s) for s in (4, 5, 6))
    exact = r.attention(q, k, v, causal=True)
    err = {mode: r.errors(r.attention_fp8(q, k, v, granularity=g, hadamard_seed=h, causal=True),
                          exact)
           for mode, g, h in (("a", "tensor", None), ("b", "block", None), ("c", "block", 9))}
    assert min(err["a"]["rmse"], err["b"]["rmse"]) > err["c"]["rmse"] > 0
    assert err["a"]["rmse"] / err["c"]["rmse"] > 1.4
    assert err["c"]["cosine"] > 0.99 and err["c"]["rel_l1"] < err["a"]["rel_l1"]


def test_errors_of_identical_arrays():
    x = np.random.default_rng(7).standard_normal(50)
    e = r.errors(x, x)
    assert e["rmse"] == 0.0 and e["rel_l1"] == 0.0 and e["cosine"] == pytest.approx(1.0)


def test_exact_v_and_p_leave_only_q_and_k_rounded():
    shape = (1, 200, 2, 64)
    q, k, v = (r.outlier_inputs(shape, seed) for seed in (11, 12, 13))
    (q8, qd), (k8, kd) = (r.quantize(x, "block") for x in (q, k))
    q_rounded = q8 * r._row_descales(qd, 1, 200, 2)[..., None]
    k_rounded = k8 * r._row_descales(kd, 1, 200, 2)[..., None]
    for causal in (False, True):
        only_qk = r.attention_fp8(q, k, v, granularity="block", causal=causal, round_v=False, round_p=False)
        np.testing.assert_allclose(only_qk, r.attention(q_rounded, k_rounded, v, causal=causal), rtol=1e-12, atol=1e-12)
        # Each further rounding moves the result.
        every = r.attention_fp8(q, k, v, granularity="block", causal=causal)
        with_v = r.attention_fp8(q, k, v, granularity="block", causal=causal, round_p=False)
        with_p = r.attention_fp8(q, k, v, granularity="block", causal=causal, round_v=False)
        for other in (every, with_v, with_p):
            assert np.abs(other - only_qk).max() > 1e-4
