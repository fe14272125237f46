"""``--gpus``: which GPU each worker process of ``tileship serve --workers N`` runs on.

A worker is pinned to one device through ``CUDA_VISIBLE_DEVICES``, set in its environment
before it starts: it sees that GPU as ``cuda:0`` and no other, so nothing in it can allocate on
or launch onto another worker's device. ``pick`` gives a new worker the listed GPU that holds
the fewest live workers (ties: the first listed), so N serving workers and the standby spread
evenly, and the replacement started after a failover goes where a worker is missing. Without
``--gpus`` workers inherit the front-end's environment (with one GPU, they share it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from tileship.digits import parse_uint
from tileship.errors import DeclarationError


def parse(text: str | None) -> tuple[int, ...]:
    """``"0,1"`` -> ``(0, 1)``; None or empty -> ``()``. Raises DeclarationError naming a bad entry
    (not a whole number >= 0, or listed twice)."""
    if not text or not text.strip():
        return ()
    out: list[int] = []
    for raw in text.split(","):
        item = raw.strip()
        if parse_uint(item) is None:
            raise DeclarationError(f"--gpus: {item!r} is not a GPU index (a whole number >= 0)",
                                   hint="list device indices as torch numbers them, e.g. --gpus 0,1")
        if int(item) in out:
            raise DeclarationError(f"--gpus: GPU {int(item)} is listed twice",
                                   hint="list each device once; workers are spread over the list")
        out.append(int(item))
    return tuple(out)


def check_visible(gpus: Sequence[int], count: int) -> None:
    """Raises DeclarationError when ``gpus`` names a device past the ``count`` this process sees
    (``count`` 0: no CUDA here, nothing to check against: the workers get the mapping as given)."""
    if count and max(gpus, default=-1) >= count:
        bad = [g for g in gpus if g >= count]
        raise DeclarationError(f"--gpus names GPU {bad[0]} but this machine has {count} visible "
                               f"(indices 0..{count - 1})", hint="check nvidia-smi and CUDA_VISIBLE_DEVICES")


def pick(gpus: Sequence[int], live: Sequence[int | None]) -> int | None:
    """The GPU for one new worker: of ``gpus``, the one fewest of ``live`` (the devices of the
    workers alive or starting) run on; None without ``--gpus``."""
    if not gpus:
        return None
    return min(gpus, key=lambda g: (sum(1 for d in live if d == g), gpus.index(g)))


def environment(gpu: int | None) -> dict[str, str] | None:
    """The environment a worker starts with: the front-end's, with ``CUDA_VISIBLE_DEVICES`` set to
    its GPU; None (inherit unchanged) without one."""
    if gpu is None:
        return None
    return {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
