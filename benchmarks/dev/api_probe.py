"""The Python API with hostile arguments, on a "c" build of the CPU catalog (round 26, CPU only).

usage: python3 benchmarks/dev/api_probe.py RELEASE_DIR

Calls ``release.op("add")`` and ``release.op("rmsnorm_cpu")`` with hostile arguments and prints, per call, the
returned shape, dtype, path and reason (OK / WRONG against torch where an answer is expected), the error's type
and message, or NON-TILESHIP for an exception outside the error tree; then 8 threads x 200 calls. A probe for a
person to read, not a test: the asserted cases live in tests/test_runtime.py and tests/test_fastpath.py.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

import tileship
from tileship.errors import TileshipError


def probe(label: str, fn: Callable[[], Any], expect: Callable[[], torch.Tensor] | None = None) -> None:
    try:
        got = fn()
    except TileshipError as exc:
        print(f"{label:24s} -> {type(exc).__name__}: {str(exc)[:150]}")
        return
    except Exception as exc:  # noqa: BLE001 - what escapes the error tree is the finding
        print(f"{label:24s} -> NON-TILESHIP {type(exc).__name__}: {str(exc)[:150]}")
        return
    out, decision = got if isinstance(got, tuple) else (got, None)
    if not isinstance(out, torch.Tensor):
        print(f"{label:24s} -> returned {type(out).__name__}")
        return
    verdict = ""
    if expect is not None:
        verdict = "OK" if torch.allclose(out, expect(), atol=1e-4, rtol=1e-4, equal_nan=True) else "WRONG"
    print(f"{label:24s} -> {tuple(out.shape)} {out.dtype} {verdict} {getattr(decision, 'path', '')} "
          f"{getattr(decision, 'reason', '')}")


def main() -> None:
    rel = tileship.load(sys.argv[1])
    add, rms = rel.op("add").call, rel.op("rmsnorm_cpu").call
    n = 4096
    a, b = torch.randn(n), torch.randn(n)
    nan = torch.full((n,), float("nan"))
    cases: list[tuple[str, Callable[[], Any], Callable[[], torch.Tensor] | None]] = [
        ("plain", lambda: add(a, b), lambda: a + b),
        ("int32", lambda: add(a.int(), b.int()), lambda: a.int() + b.int()),
        ("float64", lambda: add(a.double(), b.double()), lambda: a.double() + b.double()),
        ("mixed dtypes", lambda: add(a, b.double()), None),
        ("length mismatch", lambda: add(a, b[:100]), None),
        ("rank 2", lambda: add(a.view(64, 64), b.view(64, 64)), None),
        ("0-size", lambda: add(a[:0], b[:0]), lambda: a[:0] + b[:0]),
        ("strided", lambda: add(a[::2], b[::2]), lambda: a[::2] + b[::2]),
        ("offset view", lambda: add(a[1:], b[1:]), lambda: a[1:] + b[1:]),
        ("requires_grad", lambda: add(a.clone().requires_grad_(), b), lambda: a + b),
        ("python list", lambda: add([1.0] * n, b), None),
        ("None", lambda: add(None, b), None),
        ("0-d tensor", lambda: add(torch.tensor(1.0), b), None),
        ("one tensor", lambda: add(a), None),
        ("three tensors", lambda: add(a, b, a), None),
        ("NaN", lambda: add(nan, b), lambda: nan + b),
        ("out=", lambda: add(a, b, out=torch.empty(n)), lambda: a + b),
        ("out= wrong shape", lambda: add(a, b, out=torch.empty(n + 1)), None),
        ("out= wrong dtype", lambda: add(a, b, out=torch.empty(n, dtype=torch.float64)), None),
        ("out= strided", lambda: add(a, b, out=torch.empty(2 * n)[::2]), None),
        ("out= an int", lambda: add(a, b, out=3), None),
        ("N=5000 (dynamic)", lambda: add(torch.ones(5000), torch.ones(5000)), lambda: torch.full((5000,), 2.0)),
        ("N past the range", lambda: add(torch.ones(16777217), torch.ones(16777217)), None),
        ("meta", lambda: add(a.to("meta"), b.to("meta")), None),
        ("sparse", lambda: add(a.to_sparse(), b.to_sparse()), None),
        ("complex", lambda: add(a.to(torch.complex64), b.to(torch.complex64)), None),
        ("bool", lambda: add(a > 0, b > 0), None),
        ("stride-0 expand", lambda: add(torch.ones(1).expand(n), b), lambda: 1 + b),
        ("rmsnorm W too short", lambda: rms(torch.randn(64, 256), torch.randn(255)), None),
        ("rmsnorm rank 3", lambda: rms(torch.randn(2, 64, 256), torch.randn(256)), None),
    ]
    for label, fn, expect in cases:
        probe(label, fn, expect)
    aliased = a.clone()
    probe("out= is input A", lambda: add(aliased, b, out=aliased), lambda: a + b)
    errors: list[str] = []

    def worker() -> None:
        for _ in range(200):
            if not torch.allclose(rel.op("add")(a, b), a + b):
                errors.append("wrong")

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"8 threads x 200 calls: {len(errors)} wrong")
    print(rel.counters())


if __name__ == "__main__":
    main()
