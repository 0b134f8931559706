"""flashcute.jax (jitted, XLA FFI) beside the torch direct route, in one process.

Kernel throughput: the standard grid (batch * seqlen = 16k, nheads * headdim = 2048, bf16) at
seqlen 4k and 16k, forward and backward, causal and not. Both routes are timed alike: calls
back to back, one synchronize at the end, the median of rounds that alternate the routes' order.
"xN" rows make N dependent calls inside one jitted function (each output feeds the next call),
as a jitted training step does, against N direct torch calls.
Host overhead: CPU time per call of a jitted forward, and of a jitted forward + backward step,
against the torch direct route's calls, on small shapes where the launch dominates (calls issued
back to back without synchronizing).

    python benchmarks/jax_vs_torch.py [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from typing import Any, Callable

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import flashcute  # noqa: E402
import flashcute.jax as fj  # noqa: E402

HEAD_DIMS = (64, 128, 256)
SEQLENS = (4096, 16384)
HOST_SHAPES = [(1, 128, 128, 2, 2, 128), (1, 1, 4096, 16, 16, 128)]  # (b, sq, sk, h, hkv, d)


def seconds_per_call(fn: Callable[[], Any], sync: Callable[[Any], None], calls: int) -> float:
    result = fn()
    sync(result)
    start = time.perf_counter()
    for _ in range(calls):
        result = fn()
    sync(result)
    return (time.perf_counter() - start) / calls


def torch_sync(_: Any) -> None:
    torch.cuda.synchronize()


def jax_sync(result: Any) -> None:
    jax.block_until_ready(result)


CHAIN = 4  # calls per jitted function in the "xN" rows: the output feeds the next call


def cell(hd: int, seqlen: int, causal: bool) -> dict[str, Callable[[], Any]]:
    """The timed callables of one grid cell; "xN" ones make CHAIN dependent calls each."""
    batch, nheads = 16384 // seqlen, 2048 // hd
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(batch, seqlen, nheads, hd, device="cuda", dtype=torch.bfloat16,
                                 generator=gen) for _ in range(4))
    out, lse = flashcute.attention(q, k, v, causal=causal, return_lse=True)
    jq, jk, jv, jdout, jout, jlse = (jnp.asarray(x.cpu().float().numpy()).astype(
        jnp.float32 if x.dtype == torch.float32 else jnp.bfloat16) for x in (q, k, v, dout, out, lse))
    fwd = functools.partial(fj.attention, causal=causal)
    bwd = functools.partial(fj.attention_backward, causal=causal)

    def fwd_chain(q, k, v):
        for _ in range(CHAIN):
            q = fwd(q, k, v)
        return q

    def bwd_chain(dout, q, k, v, out, lse):
        for _ in range(CHAIN):
            dout, dk, dv = bwd(dout, q, k, v, out, lse)
        return dout, dk, dv

    def torch_fwd_chain():
        x = q
        for _ in range(CHAIN):
            x = flashcute.attention(x, k, v, causal=causal)
        return x

    def torch_bwd_chain():
        d = dout
        for _ in range(CHAIN):
            d, dk, dv = flashcute.attention_backward(d, q, k, v, out, lse, causal=causal)
        return d

    jf, jb = jax.jit(fwd), jax.jit(bwd)
    jfc, jbc = jax.jit(fwd_chain), jax.jit(bwd_chain)
    return {
        "torch fwd": lambda: flashcute.attention(q, k, v, causal=causal),
        "jax fwd": lambda: jf(jq, jk, jv),
        "torch bwd": lambda: flashcute.attention_backward(dout, q, k, v, out, lse, causal=causal),
        "jax bwd": lambda: jb(jdout, jq, jk, jv, jout, jlse),
        f"torch fwd x{CHAIN}": torch_fwd_chain,
        f"jax fwd x{CHAIN}": lambda: jfc(jq, jk, jv),
        f"torch bwd x{CHAIN}": torch_bwd_chain,
        f"jax bwd x{CHAIN}": lambda: jbc(jdout, jq, jk, jv, jout, jlse),
    }


def flops(hd: int, seqlen: int, causal: bool, backward: bool) -> float:
    batch, nheads = 16384 // seqlen, 2048 // hd
    f = 4.0 * batch * nheads * seqlen * seqlen * hd / (2 if causal else 1)
    return f * 2.5 if backward else f


def throughput(rounds: int) -> list[dict[str, Any]]:
    rows = []
    for hd in HEAD_DIMS:
        for seqlen in SEQLENS:
            for causal in (False, True):
                fns = cell(hd, seqlen, causal)
                calls = max(10, int(12e12 / flops(hd, seqlen, causal, False)))  # ~20 ms a round
                times: dict[str, list[float]] = {name: [] for name in fns}
                for r in range(rounds):
                    # Odd rounds run the routes in the other order: no route always runs second.
                    names = list(fns) if r % 2 == 0 else [n.replace("torch", "@").replace(
                        "jax", "torch").replace("@", "jax") for n in fns]
                    for name in names:
                        sync = jax_sync if name.startswith("jax") else torch_sync
                        times[name].append(seconds_per_call(fns[name], sync, calls))
                for pass_ in ("fwd", "bwd", f"fwd x{CHAIN}", f"bwd x{CHAIN}"):
                    per = CHAIN if "x" in pass_ else 1
                    row = {"feature": "dense", "pass": pass_.split()[0], "calls_per_jit": per,
                           "hdim": hd, "seqlen": seqlen, "batch": 16384 // seqlen,
                           "nheads": 2048 // hd, "causal": causal, "dtype": "bfloat16"}
                    for route in ("torch", "jax"):
                        t = statistics.median(times[f"{route} {pass_}"]) / per
                        row[f"{route}_ms"] = t * 1e3
                        row[f"{route}_tflops"] = flops(hd, seqlen, causal, "bwd" in pass_) / t / 1e12
                    row["jax_over_torch"] = row["jax_tflops"] / row["torch_tflops"]
                    rows.append(row)
                    print(f"{pass_:<7} hd{hd:<3} s{seqlen:<5} causal={causal!s:<5} torch "
                          f"{row['torch_tflops']:7.1f}  jax {row['jax_tflops']:7.1f} TFLOP/s  "
                          f"jax/torch {row['jax_over_torch']:.3f}", flush=True)
                del fns
                torch.cuda.empty_cache()
    return rows


def host_overhead(rounds: int, calls: int) -> list[dict[str, Any]]:
    rows = []
    for b, sq, sk, h, hkv, d in HOST_SHAPES:
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        jq, jk, jv = (jnp.asarray(x.cpu().float().numpy()).astype(jnp.bfloat16) for x in (q, k, v))
        jf = jax.jit(lambda q, k, v: fj.attention(q, k, v))

        def step(q, k, v):  # a forward and its backward, dout = out
            out, lse = fj.attention(q, k, v, return_lse=True)
            return fj.attention_backward(out, q, k, v, out, lse)

        def torch_step():
            out, lse = flashcute.attention(q, k, v, return_lse=True)
            return flashcute.attention_backward(out, q, k, v, out, lse)

        js = jax.jit(step)
        fns = {"torch": (lambda: flashcute.attention(q, k, v), torch_sync),
               "jax": (lambda: jf(jq, jk, jv), jax_sync),
               "torch step": (torch_step, torch_sync),
               "jax step": (lambda: js(jq, jk, jv), jax_sync)}
        us: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(rounds):
            for name, (fn, sync) in fns.items():
                for _ in range(20):
                    fn()
                sync(fn())
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                us[name].append((time.perf_counter() - start) / calls * 1e6)
                sync(fn())
        for pass_, key in (("fwd", ""), ("fwd+bwd", " step")):
            row = {"feature": "dense", "pass": pass_, "kind": "host_overhead",
                   "shape": [b, sq, sk, h, hkv, d], "torch_us": statistics.median(us["torch" + key]),
                   "jax_us": statistics.median(us["jax" + key])}
            rows.append(row)
            print(f"host us per {pass_} call {row['shape']}: torch direct {row['torch_us']:.1f}  "
                  f"jax jit {row['jax_us']:.1f}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000, help="calls per host-overhead round")
    parser.add_argument("--json", default=None)
    parser.add_argument("--host-only", action="store_true", help="only the host overhead")
    args = parser.parse_args()
    device = torch.cuda.get_device_name()
    print(f"{device}, jax {jax.__version__}, torch {torch.__version__}, "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    rows = [] if args.host_only else throughput(args.rounds)
    rows += host_overhead(args.rounds, args.calls)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "jax": jax.__version__, "torch": torch.__version__,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
