"""Closed-loop clients against a running server, for tests that change the release under load."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np


class ClosedLoop:
    """``start(url)`` runs ``clients`` threads, each calling ``call(url, rng, client)`` until ``stop()``;
    what a call returns goes to ``served``, what it raises (repr) to ``failures``."""

    def __init__(self, call: Callable[[str, Any, httpx.Client], Any], clients: int = 2) -> None:
        self.call, self.clients = call, clients
        self.served: list[Any] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, url: str) -> tuple[list[Any], list[str]]:
        def client(seed: int) -> None:
            rng = np.random.default_rng(seed)
            with httpx.Client() as c:
                while not self._stop.is_set():
                    try:
                        self.served.append(self.call(url, rng, c))
                    except Exception as exc:
                        self.failures.append(repr(exc))

        self._threads.extend(threading.Thread(target=client, args=(i,)) for i in range(self.clients))
        for t in self._threads:
            t.start()
        time.sleep(0.3)
        return self.served, self.failures

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
