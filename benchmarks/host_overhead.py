"""Host time per eager call: what a decoding loop without CUDA graphs pays before the GPU does.

Calls are issued back to back without synchronizing (`host us`: CPU time per call, the
launch rate a Python loop can sustain), then once more with a synchronize after every call
(`sync us`: host and GPU time together). flashcute is timed on its direct route (torch tensors
that nothing watches), with out=, and with an input that requires grad (the eager autograd
route, as in training); SDPA's backends run in the same process. The backward is timed the same way: a
training step's forward and backward through autograd against SDPA's, and
`flashcute.attention_backward` on its torch route against the generic DLPack route.

    python benchmarks/host_overhead.py [--calls 2000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcute
from flashcute.backward import attention_backward_dlpack

# (batch, seqlen_q, seqlen_k, nheads, nheads_kv, headdim)
SHAPES = [(1, 1, 4096, 16, 16, 128), (1, 1, 8192, 32, 8, 128), (1, 128, 128, 2, 2, 128)]
ROUNDS = 7


def per_call_us(fn: Callable[[], object], calls: int, sync_each: bool) -> float:
    """Host time per call over one round of ``calls`` calls, in microseconds."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
        if sync_each:
            torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def callables(shape: tuple[int, ...], dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    b, sq, sk, h, hkv, d = shape
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    out = torch.empty_like(q)
    q_grad = q.clone().requires_grad_(True)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    gqa = h != hkv

    def sdpa(backend: SDPBackend) -> Callable[[], object]:
        def call() -> object:
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=gqa)
        return call

    dout = torch.randn_like(q)
    with torch.no_grad():
        o, lse = flashcute.attention(q, k, v, return_lse=True)
    k_grad, v_grad = k.clone().requires_grad_(True), v.clone().requires_grad_(True)
    qt_grad, kt_grad, vt_grad = (x.transpose(1, 2) for x in (q_grad, k_grad, v_grad))
    dout_t = dout.transpose(1, 2)

    def flashcute_step() -> None:
        flashcute.attention(q_grad, k_grad, v_grad).backward(dout)

    def sdpa_step() -> None:
        F.scaled_dot_product_attention(qt_grad, kt_grad, vt_grad, enable_gqa=gqa).backward(dout_t)

    return {
        "flashcute": lambda: flashcute.attention(q, k, v),
        "flashcute out=": lambda: flashcute.attention(q, k, v, out=out),
        "flashcute requires grad": lambda: flashcute.attention(q_grad, k, v),
        "sdpa default": lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=gqa),
        "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "flashcute fwd+bwd": flashcute_step,
        "sdpa default fwd+bwd": sdpa_step,
        "flashcute bwd": lambda: flashcute.attention_backward(dout, q, k, v, o, lse),
        "flashcute bwd dlpack": lambda: attention_backward_dlpack(dout, q, k, v, o, lse),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"flashcute {flashcute.__version__}  bf16; median of {ROUNDS} rounds of {args.calls} calls")
    rows = []
    for shape in SHAPES:
        print(f"batch seqlen_q seqlen_k nheads nheads_kv hdim = {' '.join(map(str, shape))}")
        fns = callables(shape, torch.bfloat16)
        samples: dict[str, dict[str, list[float]]] = {name: {"host": [], "sync": []} for name in fns}
        for _ in range(ROUNDS):  # the implementations alternate, so host-clock drift hits all
            for name, fn in fns.items():
                try:
                    samples[name]["host"].append(per_call_us(fn, args.calls, False))
                    samples[name]["sync"].append(per_call_us(fn, args.calls // 4, True))
                except RuntimeError:  # an SDPA backend that does not take this shape
                    pass
        for name, got in samples.items():
            if not got["host"]:
                continue
            host, synced = statistics.median(got["host"]), statistics.median(got["sync"])
            print(f"  {name:20s} host {host:6.1f} us   sync {synced:6.1f} us", flush=True)
            rows.append({"shape": shape, "impl": name, "host_us": host, "sync_us": synced})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
