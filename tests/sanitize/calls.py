"""Small flashcute calls of one kernel family, for compute-sanitizer (``run.sh`` beside this).

    python tests/sanitize/calls.py FAMILY [--forward-from PATH]

FAMILY is one of ampere-fwd, hopper-fwd, ampere-bwd, ampere-bwd-deterministic, hopper-bwd.
The backward families take out and lse from a forward on the given path (``--forward-from``,
default: the same path), so that a report can be told apart from the forward's own writes.
Shapes: bf16 and fp16, head dims 64 and 128, GQA 2:1, causal and not, each without and with
a sliding window and softcap, and with both and ALiBi ((batch, nheads) slopes), odd lengths
with seqlen_q != seqlen_k.
"""

from __future__ import annotations

import argparse

import torch

import flashcute

FAMILIES = ("ampere-fwd", "hopper-fwd", "ampere-bwd", "ampere-bwd-deterministic", "hopper-bwd")
SHAPES = ((1, 129, 129), (2, 333, 129), (1, 65, 333))  # (batch, seqlen_q, seqlen_k)
# Dense, both mask features, and both with ALiBi (its slopes are made per call).
MASKS = ({}, {"window": (40, 17), "softcap": 20.0}, {"window": (40, 17), "softcap": 20.0, "alibi": True})


def _calls(family: str, forward_from: str | None) -> int:
    path = family.split("-")[0]
    built = flashcute.build_info()["backends"][path]
    head_dims = built["backward_head_dims" if "bwd" in family else "head_dims"]
    count = 0
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        if str(dtype).removeprefix("torch.") not in built["dtypes"]:
            continue
        for headdim in (64, 128):
            if headdim not in head_dims:
                continue
            for batch, seqlen_q, seqlen_k in SHAPES:
                for causal, mask in ((c, m) for c in (False, True) for m in MASKS):
                    def rand(s: int, h: int) -> torch.Tensor:
                        return torch.randn(batch, s, h, headdim, device="cuda", dtype=dtype,
                                           generator=gen)

                    q, k, v = rand(seqlen_q, 4), rand(seqlen_k, 2), rand(seqlen_k, 2)
                    mask = dict(mask)
                    if mask.pop("alibi", False):
                        mask["alibi_slopes"] = torch.rand(batch, 4, device="cuda", generator=gen)
                    if "fwd" in family:
                        flashcute.attention(q, k, v, causal=causal, return_lse=True, backend=path, **mask)
                    else:
                        out, lse = flashcute.attention(q, k, v, causal=causal, return_lse=True,
                                                       backend=forward_from or path, **mask)
                        flashcute.attention_backward(
                            rand(seqlen_q, 4), q, k, v, out, lse, causal=causal, backend=path,
                            deterministic=family.endswith("deterministic"), **mask,
                        )
                    count += 1
    torch.cuda.synchronize()
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=FAMILIES)
    parser.add_argument("--forward-from", choices=("ampere", "hopper"), default=None)
    args = parser.parse_args()
    n = _calls(args.family, args.forward_from)
    print(f"{args.family}: {n} calls")
    if n == 0:
        raise SystemExit(f"{args.family}: this build or GPU has no kernel of this family")


if __name__ == "__main__":
    main()
