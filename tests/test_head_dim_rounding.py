"""Head dims between the compiled ones, without a GPU: which head dims the argument checks
accept (every multiple of 8 from 8 to 256), and which kernel the dispatch picks for them (the
smallest compiled head dim at least as large, per path and pass; on sm90 the Hopper path keeps
a call unless its kernel is more than twice as wide as the Ampere path's, and an sm90 GPU runs
the Ampere path's sm80-only head dims on larger kernels)."""

from __future__ import annotations

import pytest

pytest.importorskip("flashcute._C")
torch = pytest.importorskip("torch")

import flashcute  # noqa: E402
from flashcute import _dispatch  # noqa: E402
from dispatch_stand_in import stand_in_extension  # noqa: E402

DEVICE_ERROR = r"^q: expected a CUDA tensor, got a CPU tensor"


def qkv(headdim, batch=2, seqlen_q=5, seqlen_k=7, nheads=4, nheads_kv=2):
    q = torch.zeros(batch, seqlen_q, nheads, headdim, dtype=torch.bfloat16)
    k = torch.zeros(batch, seqlen_k, nheads_kv, headdim, dtype=torch.bfloat16)
    return q, k, torch.zeros_like(k)


@pytest.mark.parametrize("headdim", [8, 16, 24, 40, 72, 80, 136, 200, 248, 256])
def test_multiples_of_8_pass_the_checks(headdim):
    """Every multiple of 8 up to 256 passes every check that CPU tensors can reach."""
    q, k, v = qkv(headdim)
    with pytest.raises(ValueError, match=DEVICE_ERROR):
        flashcute.attention(q, k, v)
    lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
    with pytest.raises(ValueError, match=DEVICE_ERROR):
        flashcute.attention_backward(torch.zeros_like(q), q, k, v, torch.zeros_like(q), lse)


@pytest.mark.parametrize("headdim", [0, 4, 12, 60, 100, 250, 264, 512])
def test_other_head_dims_name_q(headdim):
    """Not a multiple of 8, or above 256: a ValueError that names q, forward and backward."""
    q, k, v = qkv(headdim)
    match = rf"^q: head dim {headdim} is not supported; supported head dims are the multiples of 8"
    with pytest.raises(ValueError, match=match):
        flashcute.attention(q, k, v)
    lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
    with pytest.raises(ValueError, match=match):
        flashcute.attention_backward(torch.zeros_like(q), q, k, v, torch.zeros_like(q), lse)


# A build as the defaults compile it: the Hopper-path backward has fewer head dims.
_DEFAULT_BUILD = {
    ("ampere", False): [32, 64, 96, 128, 192, 256],
    ("ampere", True): [32, 64, 96, 128, 192, 256],
    ("hopper", False): [64, 96, 128, 192, 256],
    ("hopper", True): [64, 128, 256],
}


@pytest.fixture
def build(monkeypatch):
    """Dispatch against a stand-in build (head dims per (backend, backward)), bf16 only."""
    head_dims = dict(_DEFAULT_BUILD)

    def backend_support(backend, *, backward=False):
        dims = head_dims[(backend, backward)]
        return list(dims), ["bfloat16"] if dims else []

    monkeypatch.setattr(_dispatch, "backend_support", backend_support)
    monkeypatch.setattr(_dispatch, "load_extension", lambda: stand_in_extension(head_dims, ["bfloat16"]))
    return head_dims


AMPERE, HOPPER = 1, 2


@pytest.mark.parametrize("backend, backward, headdim, kernel", [
    ("ampere", False, 8, 32), ("ampere", False, 40, 64), ("ampere", False, 72, 96),
    ("ampere", False, 136, 192), ("ampere", False, 256, 256), ("hopper", False, 8, 64),
    ("hopper", False, 72, 96), ("hopper", True, 72, 128), ("hopper", True, 136, 256),
    ("hopper", True, 264, None),
])
def test_kernel_head_dim_is_the_smallest_at_least_as_large(build, backend, backward, headdim,
                                                           kernel):
    assert _dispatch.kernel_head_dim(backend, headdim, backward=backward) == kernel


@pytest.mark.parametrize("capability, headdim, expected", [
    (90, 32, HOPPER),    # the Hopper path's hd 64, at most twice the Ampere path's 32
    (90, 40, HOPPER),    # no exact kernel anywhere: the default path, hd 64
    (90, 96, HOPPER),
    (90, 200, HOPPER),
    (80, 40, AMPERE),
    (86, 136, AMPERE),
])
def test_forward_default_backend(build, capability, headdim, expected):
    assert _dispatch.choose_backend(None, capability, headdim=headdim, dtype="bfloat16") == expected


@pytest.mark.parametrize("headdim, deterministic, expected", [
    (64, False, HOPPER),
    (96, False, HOPPER),   # the Hopper path's 128 rather than the Ampere path's own 96
    (80, False, HOPPER),   # neither compiles 80: the Hopper path's 128
    (200, False, HOPPER),
    (32, False, HOPPER),
    (80, True, AMPERE),
])
def test_backward_default_backend(build, headdim, deterministic, expected):
    assert _dispatch.choose_backward_backend(None, 90, headdim=headdim, dtype="bfloat16",
                                             deterministic=deterministic) == expected


def test_named_backends_round_up(build):
    assert _dispatch.choose_backend("hopper", 90, headdim=8, dtype="bfloat16") == HOPPER
    assert _dispatch.choose_backward_backend("hopper", 90, headdim=72, dtype="bfloat16") == HOPPER
    assert _dispatch.choose_backend("ampere", 90, headdim=248, dtype="bfloat16") == AMPERE


def test_no_kernel_large_enough(build):
    """A build whose largest kernel is below the head dim: the error says what it compiles."""
    build[("ampere", False)] = build[("ampere", True)] = [32, 64]
    build[("hopper", True)] = [64]
    with pytest.raises(ValueError, match=r"^backend='ampere': head dim 72 has no kernel in this "
                                         r"build \(compiled: 32, 64; "):
        _dispatch.choose_backend("ampere", 80, headdim=72, dtype="bfloat16")
    # The default takes the path that has one.
    assert _dispatch.choose_backend(None, 90, headdim=72, dtype="bfloat16") == HOPPER
    with pytest.raises(ValueError, match=r"^backend='hopper': head dim 72 has no backward kernel"):
        _dispatch.choose_backward_backend("hopper", 90, headdim=72, dtype="bfloat16")
    with pytest.raises(ValueError, match=r"head dim 72 has no kernel in this build"):
        _dispatch.choose_backward_backend(None, 90, headdim=72, dtype="bfloat16")


def test_the_ampere_path_keeps_calls_the_hopper_path_would_run_more_than_twice_as_wide(build):
    build[("hopper", False)] = build[("hopper", True)] = [256]
    assert _dispatch.choose_backend(None, 90, headdim=64, dtype="bfloat16") == AMPERE
    assert _dispatch.choose_backward_backend(None, 90, headdim=64, dtype="bfloat16") == AMPERE
    assert _dispatch.choose_backend(None, 90, headdim=128, dtype="bfloat16") == HOPPER
    assert _dispatch.choose_backward_backend(None, 90, headdim=192, dtype="bfloat16") == HOPPER


def _kernel(catalogue, backend, capability, headdim, backward=False, deterministic=False):
    from flashcute import _C
    code, d, _ = _C._choose_kernel_in(catalogue, backend, capability, headdim, 0, "bfloat16",
                                      backward, deterministic)
    return code, d


@pytest.mark.parametrize("capability", [80, 86, 90, 100])
def test_sm80_only_head_dims_round_up_on_sm90_only(capability):
    """Ampere-path head dims built without sm90 code (FLASHCUTE_AMPERE_SM90_HEAD_DIMS): an
    sm90 GPU runs them on the next kernel with sm90 code; other GPUs load sm80 code or PTX."""
    from flashcute import _C
    dims = [32, 64, 96, 128, 192, 256]
    catalogue = {
        "ampere": {"head_dims": dims, "backward_head_dims": dims, "dtypes": ["bfloat16"]},
        "hopper": {"head_dims": [], "backward_head_dims": [], "dtypes": []},
        "ampere_sm80_only": [32, 96, 192],
    }
    for backend in (_C.BACKEND_AUTO, _C.BACKEND_AMPERE):
        for headdim, on_sm90 in ((8, 64), (32, 64), (40, 64), (72, 128), (96, 128), (136, 256),
                                 (192, 256), (256, 256)):
            plain = next(d for d in dims if d >= headdim)
            want = on_sm90 if capability == 90 else plain
            assert _kernel(catalogue, backend, capability, headdim) == (AMPERE, want)
            assert _kernel(catalogue, backend, capability, headdim, True, True) == (AMPERE, want)


def test_sm80_only_head_dims_beside_the_hopper_path():
    """The default build on an H200: hd 32 / 96 / 192 backward on the Hopper path, deterministic
    ones on the Ampere path's next kernel with sm90 code."""
    from flashcute import _C
    catalogue = {
        "ampere": {"head_dims": [32, 64, 96, 128, 192, 256],
                   "backward_head_dims": [32, 64, 96, 128, 192, 256], "dtypes": ["bfloat16"]},
        "hopper": {"head_dims": [64, 96, 128, 192, 256], "backward_head_dims": [64, 128, 256],
                   "dtypes": ["bfloat16"]},
        "ampere_sm80_only": [32, 96, 192],
    }
    auto = _C.BACKEND_AUTO
    assert _kernel(catalogue, auto, 90, 32) == (HOPPER, 64)
    assert _kernel(catalogue, auto, 90, 96, True) == (HOPPER, 128)
    assert _kernel(catalogue, auto, 90, 192, True) == (HOPPER, 256)
    assert _kernel(catalogue, auto, 90, 96, True, True) == (AMPERE, 128)
    assert _kernel(catalogue, auto, 90, 32, True, True) == (AMPERE, 64)
    assert _kernel(catalogue, auto, 80, 96, True, True) == (AMPERE, 96)
    assert _kernel(catalogue, auto, 80, 32) == (AMPERE, 32)
