"""``flashcute.quantize_fp8`` on the CPU: every argument check (each error names its argument),
what the call hands the extension (``quantize_fp8_workspace_size``, ``quantize_fp8``), empty
inputs, and the float64 reference the GPU tests hold the kernel to.

The plumbing tests swap the compiled extension for ``QuantizeRecordingExtension``, which has the
bindings' signatures, records each call and writes ``reference_fp8``'s results through the DLPack
views it gets, as the kernel would; the device check is lifted so that CPU tensors stand in for
CUDA ones. No GPU and no build with the binding is needed; the kernel's numbers are checked on a
GPU (tests/test_gpu_quantize_fp8.py).
"""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import flashcute  # noqa: E402
from flashcute import _build_info, _frameworks, quantize, reference_fp8  # noqa: E402


def _x(*shape, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype)


def _reference(x, block, hadamard, seed):
    """(e4m3 bytes, float32 descale) of reference_fp8 for a torch tensor."""
    y = x.double().numpy()
    if hadamard:
        y = reference_fp8.hadamard(y, seed)
    values, descale = reference_fp8.quantize(y, "block" if block else "head")
    as_fp8 = torch.from_numpy(values).to(torch.float32).to(torch.float8_e4m3fn)
    return as_fp8.view(torch.uint8), torch.from_numpy(np.asarray(descale)).to(torch.float32)


class QuantizeRecordingExtension:
    """The bindings ``quantize_fp8_workspace_size`` and ``quantize_fp8``: records each call and
    writes the reference's results into the tensors it gets."""

    WORKSPACE_PER_HEAD = 8

    def __init__(self):
        self.calls = []

    def quantize_fp8_workspace_size(self, batch, nheads, block):
        self.calls.append(("quantize_fp8_workspace_size", dict(batch=batch, nheads=nheads, block=block)))
        return 0 if block else self.WORKSPACE_PER_HEAD * batch * nheads

    def quantize_fp8(self, x, out, descale, workspace, block, hadamard, seed, stream):
        t = {name: None if v is None else torch.from_dlpack(v)
             for name, v in dict(x=x, out=out, descale=descale, workspace=workspace).items()}
        self.calls.append(("quantize_fp8", dict(
            x=(t["x"].data_ptr(), tuple(t["x"].shape), t["x"].stride(), t["x"].dtype),
            out=(t["out"].data_ptr(), tuple(t["out"].shape), t["out"].dtype, t["out"].is_contiguous()),
            descale=(t["descale"].data_ptr(), tuple(t["descale"].shape), t["descale"].dtype),
            workspace=None if t["workspace"] is None else (tuple(t["workspace"].shape), t["workspace"].dtype),
            block=block, hadamard=hadamard, seed=seed, stream=stream)))
        fp8, scales = _reference(t["x"], block, hadamard, seed)
        t["out"].copy_(fp8)
        t["descale"].copy_(scales)


@pytest.fixture
def ext(monkeypatch):
    """A QuantizeRecordingExtension in place of flashcute._C, CPU tensors passing the device
    check, stream 7 as the current stream."""
    fake = QuantizeRecordingExtension()
    monkeypatch.setattr(_build_info, "_extension", fake)
    monkeypatch.setattr(quantize, "_check_device", lambda x: None)
    monkeypatch.setattr(_frameworks.TorchFramework, "stream", lambda self, like: 7)
    return fake


# ---------------------------------------------------------------------------------------------
# Signature and exports


def test_exported():
    for name in ("quantize_fp8", "FP8_BLOCK"):
        assert name in flashcute.__all__
    assert callable(flashcute.quantize_fp8) and flashcute.quantize_fp8.__doc__
    assert flashcute.FP8_BLOCK == reference_fp8.FP8_BLOCK == 128


def test_keywords_and_defaults():
    params = inspect.signature(flashcute.quantize_fp8).parameters
    assert list(params) == ["x", "block", "hadamard", "seed"]
    assert params["x"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    for name, default in dict(block=False, hadamard=False, seed=0).items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert params[name].default == default, name


# ---------------------------------------------------------------------------------------------
# Argument checks (CPU tensors: every check but the device's comes before it)


@pytest.mark.parametrize("x", [np.zeros((1, 2, 1, 64), np.float16), [[1.0]], None, 3.0])
def test_x_must_be_a_torch_tensor(x):
    with pytest.raises(TypeError, match=r"^x: .*torch\.Tensor"):
        flashcute.quantize_fp8(x)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int8, torch.uint8, torch.float8_e4m3fn])
def test_x_dtype(dtype):
    x = torch.zeros(1, 2, 1, 64).to(dtype)
    with pytest.raises(TypeError, match=r"^x: expected float16 or bfloat16, got"):
        flashcute.quantize_fp8(x)


@pytest.mark.parametrize("shape", [(2, 1, 64), (1, 1, 2, 1, 64), (64,)])
def test_x_rank(shape):
    with pytest.raises(ValueError, match=r"^x: expected a 4-d tensor \(batch, seqlen, nheads, headdim\)"):
        flashcute.quantize_fp8(torch.zeros(shape, dtype=torch.float16))


@pytest.mark.parametrize("headdim", [0, 4, 12, 60, 264, 512])
def test_headdim(headdim):
    with pytest.raises(ValueError, match=rf"^x: expected a headdim that is a multiple of 8 from 8 to 256, got {headdim}"):
        flashcute.quantize_fp8(torch.zeros(1, 2, 1, headdim, dtype=torch.float16))


@pytest.mark.parametrize("headdim", [8, 32, 96, 136, 192, 248])
def test_hadamard_head_dims(headdim):
    x = torch.zeros(1, 2, 1, headdim, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"^x: hadamard=True needs headdim 64, 128 or 256, got headdim {headdim}"):
        flashcute.quantize_fp8(x, hadamard=True)


def test_headdim_stride():
    x = torch.zeros(1, 64, 1, 8, dtype=torch.float16).transpose(1, 3)  # (1, 8, 1, 64), stride 8 in d
    with pytest.raises(ValueError, match=r"^x: expected unit stride in the last \(headdim\) dimension"):
        flashcute.quantize_fp8(x)


def test_alignment():
    base = torch.zeros(1 * 4 * 2 * 64 + 8, dtype=torch.bfloat16)
    offset = base[1:].as_strided((1, 4, 2, 64), (512, 128, 64, 1))  # pointer 2 bytes past 16
    with pytest.raises(ValueError, match=r"^x: the kernel reads 16-byte vectors.*pointer % 16 = 2"):
        flashcute.quantize_fp8(offset)
    rows = base.as_strided((1, 4, 1, 64), (4 * 68, 68, 64, 1))  # rows 136 bytes apart
    with pytest.raises(ValueError, match=r"^x: the kernel reads 16-byte vectors.*multiples of 8 elements"):
        flashcute.quantize_fp8(rows)


@pytest.mark.parametrize("name", ["block", "hadamard"])
@pytest.mark.parametrize("value", [1, 0, None, "yes", np.bool_(True)])
def test_flags_are_bools(name, value):
    with pytest.raises(TypeError, match=rf"^{name}: expected a bool, got"):
        flashcute.quantize_fp8(_x(1, 2, 1, 64), **{name: value})


@pytest.mark.parametrize("seed", [1.0, True, "1", None, np.uint64(3)])
def test_seed_type(seed):
    with pytest.raises(TypeError, match=r"^seed: expected an int, got"):
        flashcute.quantize_fp8(_x(1, 2, 1, 64), hadamard=True, seed=seed)


@pytest.mark.parametrize("seed", [-1, 2**64, 2**70])
def test_seed_range(seed):
    with pytest.raises(ValueError, match=rf"^seed: expected an int in \[0, 2\*\*64\), got {seed}"):
        flashcute.quantize_fp8(_x(1, 2, 1, 64), seed=seed)


def test_device_is_checked_last():
    x = _x(1, 2, 1, 64)
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor, got a cpu tensor"):
        flashcute.quantize_fp8(x)
    with pytest.raises(ValueError, match=r"^x: expected a headdim"):  # shape before device
        flashcute.quantize_fp8(_x(1, 2, 1, 12))


def test_missing_binding_is_an_import_error(monkeypatch):
    monkeypatch.setattr(_build_info, "_extension", object())
    monkeypatch.setattr(quantize, "_check_device", lambda x: None)
    with pytest.raises(ImportError, match=r"has no quantize_fp8"):
        flashcute.quantize_fp8(_x(1, 2, 1, 64))


# ---------------------------------------------------------------------------------------------
# What reaches the extension


@pytest.mark.parametrize("block", [False, True])
@pytest.mark.parametrize("hadamard,seed", [(False, 0), (True, 2**64 - 1)])
def test_call_arguments(ext, block, hadamard, seed):
    big = _x(2, 130, 5, 64, dtype=torch.float16)
    x = big[:, :, 1:4]  # strided heads: passed as they are, no copy
    x_fp8, descale = flashcute.quantize_fp8(x, block=block, hadamard=hadamard, seed=seed)
    names = [name for name, _ in ext.calls]
    assert names == ["quantize_fp8_workspace_size", "quantize_fp8"]
    assert ext.calls[0][1] == dict(batch=2, nheads=3, block=block)
    call = ext.calls[1][1]
    assert call["x"] == (x.data_ptr(), (2, 130, 3, 64), x.stride(), torch.float16)
    assert call["out"] == (x_fp8.data_ptr(), (2, 130, 3, 64), torch.uint8, True)
    blocks = 2  # ceil(130 / 128)
    assert call["descale"] == (descale.data_ptr(), (2, 3, blocks) if block else (2, 3), torch.float32)
    assert call["workspace"] == (None if block else ((8 * 2 * 3,), torch.uint8))
    assert (call["block"], call["hadamard"], call["seed"], call["stream"]) == (block, hadamard, seed, 7)
    assert x_fp8.dtype == torch.float8_e4m3fn and x_fp8.is_contiguous() and x_fp8.shape == x.shape
    assert descale.dtype == torch.float32 and not x_fp8.requires_grad
    expected_fp8, expected_descale = _reference(x, block, hadamard, seed)
    assert torch.equal(x_fp8.view(torch.uint8), expected_fp8)
    assert torch.equal(descale, expected_descale)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("headdim", [8, 24, 64, 200, 256])
def test_dtypes_and_head_dims_reach_the_extension(ext, dtype, headdim):
    x = _x(1, 3, 2, headdim, dtype=dtype)
    x_fp8, descale = flashcute.quantize_fp8(x, block=True)
    call = ext.calls[-1][1]
    assert call["x"][1:] == ((1, 3, 2, headdim), x.stride(), dtype)
    assert x_fp8.shape == (1, 3, 2, headdim) and descale.shape == (1, 2, 1)


def test_requires_grad_input(ext):
    x = _x(1, 4, 2, 64).requires_grad_()
    x_fp8, descale = flashcute.quantize_fp8(x)
    assert not x_fp8.requires_grad and not descale.requires_grad
    assert ext.calls[-1][1]["x"][0] == x.data_ptr()


@pytest.mark.parametrize("shape", [(2, 0, 3, 64), (0, 5, 3, 64), (2, 5, 0, 64)])
@pytest.mark.parametrize("block", [False, True])
def test_empty_inputs_launch_nothing(ext, shape, block):
    x = torch.zeros(shape, dtype=torch.bfloat16)
    x_fp8, descale = flashcute.quantize_fp8(x, block=block, hadamard=True)
    assert ext.calls == []
    assert x_fp8.shape == shape and x_fp8.dtype == torch.float8_e4m3fn
    b, s, h, _ = shape
    assert descale.shape == ((b, h, -(-s // 128)) if block else (b, h))
    assert torch.all(descale == 1)  # an empty head's scale (reference_fp8.quantize: amax 0)
    if not block:
        _, expected = reference_fp8.quantize(np.zeros(shape), "head")
        assert torch.equal(descale, torch.from_numpy(expected).float())


# ---------------------------------------------------------------------------------------------
# The reference the GPU tests compare with


def test_reference_scales_and_zero_groups():
    x = _x(1, 300, 2, 64, dtype=torch.float32)
    x[:, :, 1] = 0  # head 1: zeros
    x[:, 128:256, 0] = 0  # head 0, block 1: zeros
    fp8, descale = _reference(x, False, False, 0)
    assert descale[0, 1] == 1 and descale[0, 0] == x[:, :, 0].abs().max() / 448
    assert torch.all(fp8.view(1, 300, 2, 64)[:, :, 1] == 0)
    _, blocks = _reference(x, True, False, 0)
    assert blocks.shape == (1, 2, 3) and blocks[0, 0, 1] == 1 and torch.all(blocks[0, 1] == 1)


def test_reference_hadamard_signs_match_the_kernels_mix():
    """The kernel draws sign j as the top bit of the same 64-bit mix (cpp/quantize_fp8.h)."""
    mask = 2**64 - 1
    for seed in (0, 1, 2**63, 2**64 - 1):
        signs = reference_fp8.hadamard_signs(256, seed)
        for j in (0, 1, 100, 255):
            h = (seed * 0x9E3779B97F4A7C15 + (j + 1) * 0xBF58476D1CE4E5B9) & mask
            h ^= h >> 31
            h = (h * 0x94D049BB133111EB) & mask
            h ^= h >> 29
            assert signs[j] == (-1.0 if h >> 63 else 1.0)
