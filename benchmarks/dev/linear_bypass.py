"""A swapped ``nn.Linear`` on the reference path: its host time beside the PyTorch layer (development).

usage: python benchmarks/dev/linear_bypass.py RELEASE [--features 64] [--rounds 9] [--calls 20000]

RELEASE has a ``gemm`` operator (``A(M,K) @ B(K,N)``); the layer here is CPU and its size is not
declared, so every call goes to the reference, as an M=1 decode GEMM does on the H200 when the
evidence routes it to cuBLAS. Three layers over one weight, side by side in one process, rounds
alternating: ``nn.Linear``; ``KernelLinear`` with its bypass (``F.linear`` on the layer's own
parameters, counted in telemetry); the same ``KernelLinear`` forced through the operator (its
``_eager`` flag off: reshape, W^T product, the ``EagerOp`` and the dispatcher), which is what every
swapped layer did before the bypass. Prints us per call: median and spread (max - min) of the
rounds; a difference within the larger spread is "not resolved".
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from torch import nn


def per_call_us(fn: Any, x: Any, calls: int) -> float:
    t = time.perf_counter_ns()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter_ns() - t) / calls / 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("release")
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    import tileship
    from tileship.torchops.custom_ops import register
    from tileship.torchops.swap import KernelLinear

    release = tileship.load(args.release, allow_unverified=True)
    ops = register(release)
    torch.set_grad_enabled(False)
    lin = nn.Linear(args.features, args.features, bias=False)
    bypass = KernelLinear(lin, ops.eager("gemm"))
    through = KernelLinear(lin, ops.eager("gemm"))
    through._eager = False
    x = torch.randn(1, args.features)
    layers = {"nn.Linear": lin, "KernelLinear, bypass": bypass, "KernelLinear, through the op": through}
    for f in layers.values():
        torch.testing.assert_close(f(x), lin(x))
    times: dict[str, list[float]] = {k: [] for k in layers}
    for _ in range(args.rounds):
        for k, f in layers.items():
            times[k].append(per_call_us(f, x, args.calls))
    print(f"release {release.release_id}, {args.features}x{args.features} fp32 on the CPU, M=1, "
          f"{args.rounds} rounds x {args.calls} calls; gemm counters {release.counters()['gemm']}")
    med = {k: statistics.median(v) for k, v in times.items()}
    spread = {k: max(v) - min(v) for k, v in times.items()}
    for k in layers:
        print(f"  {k:30} {med[k]:7.2f} us (spread {spread[k]:.2f})")
    for k in list(layers)[1:]:
        d, s = med[k] - med["nn.Linear"], max(spread[k], spread["nn.Linear"])
        verdict = f"{d:+.2f} us" if abs(d) > s else f"not resolved ({d:+.2f}, spread {s:.2f})"
        print(f"  {k} - nn.Linear: {verdict}")


if __name__ == "__main__":
    main()
