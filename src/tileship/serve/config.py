"""The server's settings (ServeConfig): one frozen dataclass, filled by tileship serve's flags."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from tileship.serve.holder import Loader


@dataclass(frozen=True)
class ServeConfig:
    """How a server runs. ``source``: a release directory or a registry directory."""

    source: Path
    max_body_bytes: int = 64 << 20
    max_inflight: int = 64
    worker_threads: int = 1
    request_timeout_s: float = 30.0
    body_timeout_s: float = 30.0
    strict_shapes: bool = False
    drift_policy: str | None = None
    allow_unverified: bool | None = None
    trusted_keys: tuple[Path, ...] | None = None
    reference_only: bool = False
    check_finite: bool = True
    warmup_limit: int = 256
    diagnostics_dir: Path | None = None
    handle_sighup: bool = False
    #: a whole model served next to the operators (``examples.llama.serve.LlamaSpec``; ``--llama``)
    llama: Any = None
    #: test hook: (release path, reference_only) -> Release; default tileship.runtime.loader.load
    loader: Loader | None = None
    log_stream: TextIO | None = None
