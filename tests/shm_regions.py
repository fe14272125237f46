"""tritonclient system shared-memory regions for the serve tests: created by one test, destroyed after it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import tritonclient.utils.shared_memory as shm


class Shm:
    """The regions one test created (``create``); ``regions`` destroys them after the test."""

    def __init__(self, prefix: str = "r") -> None:
        self.prefix = prefix
        self.handles: list[Any] = []

    def create(self, byte_size: int) -> tuple[Any, str, str]:
        """(handle, region name, key) of a fresh /dev/shm object of ``byte_size`` bytes."""
        tag = uuid.uuid4().hex[:12]
        name, key = f"{self.prefix}_{tag}", f"/tileship_test_{tag}"
        self.handles.append(h := shm.create_shared_memory_region(name, key, byte_size))
        return h, name, key


def regions(prefix: str = "r") -> Iterator[Shm]:
    """The body of a ``regions`` fixture: yields a ``Shm``, then destroys every region it created."""
    s = Shm(prefix)
    yield s
    for h in s.handles:
        shm.destroy_shared_memory_region(h)
