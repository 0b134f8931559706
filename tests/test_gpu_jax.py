"""flashcute.jax on the GPU: jit, grad, vmap, jit(grad), shard_map and command buffers against a
float32 jax reference; causal, GQA, windows, ALiBi, softcap, varlen, dropout; trace-time errors."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with torch tests
np = pytest.importorskip("numpy")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def fj():
    try:
        if not jax.devices("gpu"):
            pytest.skip("jax has no GPU device")
    except RuntimeError:
        pytest.skip("jax has no GPU device")
    import flashcute.jax

    return flashcute.jax


HIGHEST = jax.lax.Precision.HIGHEST


def reference(q, k, v, *, causal=False, scale=None, window=(-1, -1), softcap=0.0, alibi=None):
    """(out, lse) in float32 with the flashcute semantics (bottom-right aligned masks)."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    sq, h, d = q.shape[1], q.shape[2], q.shape[3]
    sk, hk = k.shape[1], k.shape[2]
    k = jnp.repeat(k, h // hk, axis=2)
    v = jnp.repeat(v, h // hk, axis=2)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=HIGHEST) * scale
    if softcap > 0:
        s = softcap * jnp.tanh(s / softcap)
    i = jnp.arange(sq)[:, None] + sk - sq
    j = jnp.arange(sk)[None, :]
    if alibi is not None:
        slopes = jnp.broadcast_to(alibi, (q.shape[0], h)).astype(jnp.float32)
        s = s - slopes[:, :, None, None] * jnp.abs(i - j)[None, None]
    left, right = window
    if causal:
        right = 0
    visible = jnp.ones((sq, sk), bool)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    s = jnp.where(visible, s, -jnp.inf)
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.where(visible, jnp.exp(s - jnp.where(jnp.isfinite(lse), lse, 0.0)[..., None]), 0.0)
    out = jnp.einsum("bhqk,bkhd->bqhd", p, v, precision=HIGHEST)
    return out, lse


def inputs(seed, b, sq, sk, h, hk, d, dtype=jnp.bfloat16, dv=None):
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = jax.random.normal(keys[0], (b, sq, h, d), jnp.float32).astype(dtype)
    k = jax.random.normal(keys[1], (b, sk, hk, d), jnp.float32).astype(dtype)
    v = jax.random.normal(keys[2], (b, sk, hk, dv or d), jnp.float32).astype(dtype)
    return q, k, v


def tol(dtype):
    return 2e-2 if dtype == jnp.bfloat16 else 4e-3


def close(actual, expected, atol, what):
    actual = np.asarray(actual, np.float32)
    expected = np.asarray(expected, np.float32)
    assert actual.shape == expected.shape, what
    assert np.isfinite(actual).all(), what
    err = np.abs(actual - expected).max() if actual.size else 0.0
    assert err <= atol, f"{what}: max error {err} > {atol}"


def rel_close(actual, expected, rtol, what):
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    err = np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-6)
    assert err <= rtol, f"{what}: relative error {err} > {rtol}"


CASES = [
    # b, sq, sk, h, hk, d, causal
    (2, 131, 257, 4, 2, 64, False),
    (2, 257, 131, 4, 1, 128, True),
    (1, 200, 333, 6, 3, 96, True),
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("b,sq,sk,h,hk,d,causal", CASES)
def test_jit_forward_and_lse(fj, b, sq, sk, h, hk, d, causal, dtype):
    q, k, v = inputs(1, b, sq, sk, h, hk, d, dtype)
    f = jax.jit(lambda q, k, v: fj.attention(q, k, v, causal=causal, return_lse=True))
    out, lse = f(q, k, v)
    ref_out, ref_lse = reference(q, k, v, causal=causal)
    assert out.dtype == dtype and lse.dtype == jnp.float32
    close(out, ref_out, tol(dtype), "out")
    finite = np.isfinite(np.asarray(ref_lse))
    assert (np.isfinite(np.asarray(lse)) == finite).all()
    close(np.where(finite, lse, 0), np.where(finite, ref_lse, 0), 1e-2, "lse")


@pytest.mark.parametrize("b,sq,sk,h,hk,d,causal", CASES)
def test_grad_and_jit_grad(fj, b, sq, sk, h, hk, d, causal):
    q, k, v = inputs(2, b, sq, sk, h, hk, d)
    w = jax.random.normal(jax.random.PRNGKey(9), (b, sq, h, d), jnp.float32)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * w)

    ours = loss(lambda q, k, v: fj.attention(q, k, v, causal=causal))
    ref = loss(lambda q, k, v: reference(q, k, v, causal=causal)[0])
    grads = jax.grad(ours, argnums=(0, 1, 2))(q, k, v)
    jitted = jax.jit(jax.grad(ours, argnums=(0, 1, 2)))(q, k, v)
    expected = jax.grad(ref, argnums=(0, 1, 2))(q, k, v)
    for name, g, gj, e in zip("qkv", grads, jitted, expected):
        assert g.dtype == q.dtype and g.shape == e.shape
        rel_close(g, e, 2e-2, f"d{name}")
        rel_close(gj, e, 2e-2, f"jit d{name}")


def test_attention_backward_matches_grad(fj):
    q, k, v = inputs(3, 2, 160, 190, 4, 2, 64)
    dout = jax.random.normal(jax.random.PRNGKey(4), q.shape, jnp.float32).astype(q.dtype)
    out, lse = fj.attention(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = jax.jit(lambda *a: fj.attention_backward(*a, causal=True))(dout, q, k, v, out, lse)
    _, vjp = jax.vjp(lambda q, k, v: fj.attention(q, k, v, causal=True), q, k, v)
    for name, a, b in zip("qkv", (dq, dk, dv), vjp(dout)):  # dQ is summed with atomics
        rel_close(a, b, 1e-3, f"d{name}")


def test_vmap_one_launch_matches_per_item(fj):
    q, k, v = inputs(5, 6, 130, 150, 4, 2, 64)
    q, k, v = (x.reshape(3, 2, *x.shape[1:]) for x in (q, k, v))
    mapped = jax.jit(jax.vmap(lambda q, k, v: fj.attention(q, k, v, causal=True)))(q, k, v)
    assert mapped.shape == q.shape
    for n in range(3):
        ref_out, _ = reference(q[n], k[n], v[n], causal=True)
        close(mapped[n], ref_out, tol(jnp.bfloat16), f"vmap item {n}")
    text = jax.jit(jax.vmap(lambda q, k, v: fj.attention(q, k, v))).lower(q, k, v).as_text()
    assert text.count("flashcute_attention_forward") == 1  # one call, not a loop


def test_vmap_grad(fj):
    q, k, v = inputs(6, 4, 96, 96, 2, 2, 64)
    q, k, v = (x.reshape(2, 2, *x.shape[1:]) for x in (q, k, v))

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) ** 2)

    ours = jax.vmap(jax.grad(loss(lambda *a: fj.attention(*a, causal=True)), argnums=(0, 1, 2)))(q, k, v)
    ref = jax.vmap(jax.grad(loss(lambda *a: reference(*a, causal=True)[0]), argnums=(0, 1, 2)))(q, k, v)
    for name, a, b in zip("qkv", ours, ref):
        rel_close(a, b, 2e-2, f"vmap d{name}")


def test_masks_alibi_softcap_gqa(fj):
    q, k, v = inputs(7, 2, 150, 300, 8, 2, 128)
    slopes = jnp.linspace(0.05, 0.5, 8, dtype=jnp.float32)
    kw = dict(window=(40, 7), softcap=20.0, alibi_slopes=slopes)
    out = jax.jit(lambda q, k, v: fj.attention(q, k, v, **kw))(q, k, v)
    ref_out, _ = reference(q, k, v, window=(40, 7), softcap=20.0, alibi=slopes)
    close(out, ref_out, tol(jnp.bfloat16), "out")
    w = jax.random.normal(jax.random.PRNGKey(1), out.shape, jnp.float32)
    g = jax.grad(lambda q, k, v: jnp.sum(fj.attention(q, k, v, **kw).astype(jnp.float32) * w),
                 argnums=(0, 1, 2))(q, k, v)
    e = jax.grad(lambda q, k, v: jnp.sum(reference(q, k, v, window=(40, 7), softcap=20.0,
                                                   alibi=slopes)[0] * w), argnums=(0, 1, 2))(q, k, v)
    for name, a, b in zip("qkv", g, e):
        rel_close(a, b, 2e-2, f"d{name}")


def test_varlen_against_per_sequence_reference(fj):
    lengths_q, lengths_k = [0, 1, 77, 200], [5, 1, 130, 200]
    cu_q = jnp.asarray(np.cumsum([0] + lengths_q), jnp.int32)
    cu_k = jnp.asarray(np.cumsum([0] + lengths_k), jnp.int32)
    h, hk, d = 4, 2, 64
    keys = jax.random.split(jax.random.PRNGKey(11), 4)
    q = jax.random.normal(keys[0], (sum(lengths_q), h, d)).astype(jnp.bfloat16)
    k = jax.random.normal(keys[1], (sum(lengths_k), hk, d)).astype(jnp.bfloat16)
    v = jax.random.normal(keys[2], (sum(lengths_k), hk, d)).astype(jnp.bfloat16)
    w = jax.random.normal(keys[3], q.shape, jnp.float32)

    def ours(q, k, v):
        return fj.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True,
                                   return_lse=True)

    out, lse = jax.jit(ours)(q, k, v)
    assert lse.shape == (h, q.shape[0])
    g = jax.grad(lambda *a: jnp.sum(ours(*a)[0].astype(jnp.float32) * w), argnums=(0, 1, 2))(q, k, v)
    for i in range(len(lengths_q)):
        qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        if lengths_q[i] == 0:
            continue
        ref_out, _ = reference(q[None, qs], k[None, ks], v[None, ks], causal=True)
        close(out[qs], ref_out[0], tol(jnp.bfloat16), f"sequence {i}")
        e = jax.grad(lambda a, b_, c: jnp.sum(reference(a[None], b_[None], c[None], causal=True)[0][0]
                                              * w[qs]), argnums=(0, 1, 2))(q[qs], k[ks], v[ks])
        rel_close(g[0][qs], e[0], 3e-2, f"dq sequence {i}")
        rel_close(g[1][ks], e[1], 3e-2, f"dk sequence {i}")
        rel_close(g[2][ks], e[2], 3e-2, f"dv sequence {i}")


def test_varlen_backward_matches_grad(fj):
    cu = jnp.asarray([0, 3, 3, 130, 190], jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(21), 4)
    q, k, v, dout = (jax.random.normal(kk, (190, 4, 64)).astype(jnp.bfloat16) for kk in keys)
    kw = dict(causal=True, window=(50, 0))
    out, lse = fj.attention_varlen(q, k, v, cu, cu, 127, 127, return_lse=True, **kw)
    grads = jax.jit(lambda *a: fj.attention_varlen_backward(*a, cu, cu, 127, 127, **kw))(
        dout, q, k, v, out, lse)
    _, vjp = jax.vjp(lambda q, k, v: fj.attention_varlen(q, k, v, cu, cu, 127, 127, **kw), q, k, v)
    for name, a, b in zip("qkv", grads, vjp(dout)):  # dQ is summed with atomics
        rel_close(a, b, 1e-3, f"d{name}")


def test_dropout_matches_the_dlpack_path(fj):
    import flashcute

    q, k, v = inputs(12, 2, 128, 192, 4, 2, 64)
    seed, offset = 2**40 + 12345, 77
    eager = flashcute.attention(q, k, v, dropout_p=0.2, dropout_seed=seed, dropout_offset=offset)
    ints = jax.jit(lambda q, k, v: fj.attention(q, k, v, dropout_p=0.2, dropout_seed=seed,
                                                dropout_offset=offset))(q, k, v)
    words = jnp.asarray(np.array([seed & 0xFFFFFFFF, seed >> 32, offset, 0], np.uint32))
    traced = jax.jit(lambda q, k, v, s: fj.attention(q, k, v, dropout_p=0.2,
                                                     dropout_rng_state=s))(q, k, v, words)
    np.testing.assert_array_equal(np.asarray(ints, np.float32), np.asarray(eager, np.float32))
    np.testing.assert_array_equal(np.asarray(traced, np.float32), np.asarray(eager, np.float32))
    other = fj.attention(q, k, v, dropout_p=0.2, dropout_seed=seed + 1, dropout_offset=offset)
    assert not np.array_equal(np.asarray(other, np.float32), np.asarray(eager, np.float32))
    # The backward regenerates the forward's mask: its gradients match the DLPack backward's.
    dout = jax.random.normal(jax.random.PRNGKey(3), q.shape, jnp.float32).astype(q.dtype)
    out, lse = flashcute.attention(q, k, v, dropout_p=0.2, dropout_seed=seed, dropout_offset=offset,
                                   return_lse=True)
    expected = flashcute.attention_backward(dout, q, k, v, out, lse, dropout_p=0.2, dropout_seed=seed,
                                            dropout_offset=offset)
    _, vjp = jax.vjp(lambda q, k, v: fj.attention(q, k, v, dropout_p=0.2, dropout_seed=seed,
                                                  dropout_offset=offset), q, k, v)
    for name, a, b in zip("qkv", vjp(dout), expected):
        rel_close(a, b, 1e-3, f"d{name}")


def test_shard_map(fj):
    from jax.sharding import Mesh, PartitionSpec as P

    try:
        from jax import shard_map
    except ImportError:
        from jax.experimental.shard_map import shard_map
    mesh = Mesh(np.array(jax.devices("gpu")), ("b",))
    q, k, v = inputs(13, 2 * len(mesh.devices), 100, 120, 4, 2, 64)
    f = shard_map(lambda q, k, v: fj.attention(q, k, v, causal=True), mesh=mesh,
                  in_specs=(P("b"), P("b"), P("b")), out_specs=P("b"))
    out = jax.jit(f)(q, k, v)
    close(out, reference(q, k, v, causal=True)[0], tol(jnp.bfloat16), "shard_map out")


def test_trace_time_errors(fj):
    q, k, v = inputs(14, 1, 64, 64, 4, 2, 64)
    lower = lambda f, *a: jax.jit(f).lower(*a)  # noqa: E731  (tracing only: nothing runs)
    with pytest.raises(TypeError, match="q: expected float16 or bfloat16"):
        lower(lambda q, k, v: fj.attention(q, k, v), q.astype(jnp.float32), k, v)
    with pytest.raises(TypeError, match="k: dtype"):
        lower(lambda q, k, v: fj.attention(q, k, v), q, k.astype(jnp.float16), v)
    with pytest.raises(ValueError, match="k: head dim"):
        lower(lambda q, k, v: fj.attention(q, k, v), q, k[..., :32], v)
    with pytest.raises(ValueError, match="nheads"):
        lower(lambda q, k, v: fj.attention(q, k, v), q[:, :, :3], k, v)
    with pytest.raises(ValueError, match="window"):
        lower(lambda q, k, v: fj.attention(q, k, v, window=(-2, 0)), q, k, v)
    with pytest.raises(ValueError, match="alibi_slopes"):
        lower(lambda q, k, v: fj.attention(q, k, v, alibi_slopes=jnp.ones((3,), jnp.float32)), q, k, v)
    with pytest.raises(ValueError, match="dropout_seed"):
        lower(lambda q, k, v: fj.attention(q, k, v, dropout_p=0.1), q, k, v)
    with pytest.raises(ValueError, match="dropout_rng_state"):
        lower(lambda q, k, v: fj.attention(q, k, v, dropout_p=0.1,
                                           dropout_rng_state=jnp.zeros((3,), jnp.uint32)), q, k, v)
    with pytest.raises(TypeError, match="max_seqlen_q"):
        cu = jnp.asarray([0, 64], jnp.int32)
        lower(lambda q, k, v: fj.attention_varlen(q[0], k[0], v[0], cu, cu, 64.0, 64), q, k, v)
    with pytest.raises(ValueError, match="deterministic"):
        lower(lambda q, k, v: fj.attention_backward(q, q, k, v, q, q[..., 0], deterministic=True,
                                                    backend="hopper"), q, k, v)


def test_command_buffers_and_graph_replay():
    """With command buffers (CUDA graphs) enabled for custom calls, the handlers (declared
    command-buffer compatible) run and replays give the same results."""
    script = textwrap.dedent("""
        import os
        os.environ["XLA_FLAGS"] = ("--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL "
                                   "--xla_gpu_graph_min_graph_size=1")
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        import jax, jax.numpy as jnp, numpy as np
        import flashcute.jax as fj
        keys = jax.random.split(jax.random.PRNGKey(0), 3)
        q, k, v = (jax.random.normal(kk, (2, 256, 4, 64)).astype(jnp.bfloat16) for kk in keys)
        step = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fj.attention(q, k, v, causal=True,
                                                                     deterministic=True)
                                                        .astype(jnp.float32) ** 2), argnums=(0, 1, 2)))
        first = [np.asarray(g, np.float32) for g in step(q, k, v)]
        for _ in range(3):  # replays
            again = [np.asarray(g, np.float32) for g in step(q, k, v)]
        assert all(np.array_equal(a, b) for a, b in zip(first, again))
        print("ok")
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="command_buffer_conversion_pass=3")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env=env)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]
    # Where XLA logs its conversion (thunk-level command buffers), the calls are in one: the
    # step's only custom calls are flashcute's.
    recorded = [line for line in result.stderr.splitlines() if "Creating command buffer thunk" in line]
    if "CommandBufferConfig" in result.stderr:
        assert any("ffi_call" in line for line in recorded), "\n".join(recorded)
