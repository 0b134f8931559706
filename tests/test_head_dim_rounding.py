"""Head dims between the compiled ones, without a GPU: which head dims the argument checks
accept (every multiple of 8 from 8 to 256), and which kernel the dispatch picks for them (the
smallest compiled head dim at least as large, per path and pass; a head dim that only the
other path compiles exactly keeps running there)."""

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
    (90, 32, AMPERE),    # only the Ampere path compiles 32: it keeps running there
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
    (96, False, AMPERE),   # the Ampere path's own hd 96 rather than the Hopper path's 128
    (80, False, HOPPER),   # neither compiles 80: the Hopper path's 128
    (200, False, HOPPER),
    (32, False, AMPERE),
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
