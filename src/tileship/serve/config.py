"""The server's settings (ServeConfig): one frozen dataclass, filled by tileship serve's flags."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from tileship.serve.holder import LoadHook
from tileship.serve.validate import RequestLimits


@dataclass(frozen=True)
class ServeConfig:
    """How a server runs. ``source``: a release directory or a registry directory.

    gRPC (``grpc_port``) carries one request and one answer in one protobuf message, at most
    ``grpc_max_message_bytes`` (2 GiB - 1), whatever ``max_body_bytes`` and ``limits.max_output_bytes``
    allow: a larger request is refused RESOURCE_EXHAUSTED (counted as ``tileship_rejected_total{reason=
    "grpc_message_too_large"}``), a larger answer before its call runs. REST keeps the larger limits.
    ``grpc_capped`` says so, and the server logs it at start (``grpc_limits``, a warning, never a refusal).
    """

    source: Path
    max_body_bytes: int = 64 << 20
    max_inflight: int = 64
    worker_threads: int = 1
    #: worker processes running the calls (``serve.worker_pool``; plus one warm standby); 0: in this process
    workers: int = 0
    #: ``--gpus``: the devices the workers are spread over (``serve.gpu_map``); (): they share the front-end's
    gpus: tuple[int, ...] = ()
    #: seconds a worker may take to answer one call before it is killed and replaced (None: ``request_timeout_s``)
    worker_timeout_s: float | None = None
    request_timeout_s: float = 30.0
    #: in process, a small call whose last run a kernel served within this many microseconds runs on the
    #: event loop, not a request thread (``serve.handoff``); 0: every call goes to a thread
    inline_us: float = 500.0
    #: with workers: a worker polls this many microseconds for its next call after each answer before it
    #: sleeps, and the event loop polls ``loop_spin_us`` for a small call's answer (``serve.workers``); 0: off;
    #: None: ``default_spin_us()`` for the CPUs this process may use (``spin_us``)
    worker_spin_us: float | None = None
    loop_spin_us: float | None = None
    body_timeout_s: float = 30.0
    #: threads reading request bodies with at least 4 MiB still to come straight from the socket into their
    #: block, off the event loop (``serve.body_pull``); 0 (the default): every body is read on the event loop.
    #: With 8, 64 clients of a 4096^3 fp16 GEMM took 21.1-21.7 req/s on the H200 against 23.2-23.8 with 0 (round 22)
    body_threads: int = 0
    #: bounds on one request: ranks, dims, elements, JSON nesting, output bytes (``--max-output-mib``)
    limits: RequestLimits = RequestLimits()
    #: connections: at most this many (503 past it), request headers within ``header_timeout_s``
    #: (the connection is closed after), idle keep-alive connections closed after ``keep_alive_s``
    max_connections: int = 1024
    header_timeout_s: float = 10.0
    keep_alive_s: int = 5
    #: the KServe v2 gRPC endpoint (``serve.grpc_service``) on this port next to REST; None: off, 0: a free port
    grpc_port: int | None = None
    grpc_host: str = "127.0.0.1"
    #: the largest gRPC message either way: protobuf's limit (``grpc_codec.MAX_MESSAGE``, 2 GiB - 1) whatever the
    #: body and output limits allow; a request past it is RESOURCE_EXHAUSTED on receipt, an answer before it runs.
    #: A test lowers it
    grpc_max_message_bytes: int = (1 << 31) - 1
    strict_shapes: bool = False
    drift_policy: str | None = None
    allow_unverified: bool | None = None
    trusted_keys: tuple[Path, ...] | None = None
    #: activator public keys a registry source's pointer must be sealed by (``release.pointer_seal``;
    #: ``--trusted-activator-key``); None: ``TILESHIP_TRUSTED_ACTIVATOR_KEYS``, and none there: not checked
    trusted_activator_keys: tuple[Path, ...] | None = None
    #: under trusted activator keys: the file keeping the pointer served across restarts (``--generation-state``,
    #: ``pointer_served.write_served``); None: not kept, a fresh process trusts the first validly sealed pointer
    generation_state: Path | None = None
    #: under trusted activator keys: the registry id every pointer must be bound to, from the first one on
    #: (``--trusted-registry-id``); None: ``TILESHIP_TRUSTED_REGISTRY_ID``, and none there: trusted on first use
    trusted_registry_id: str | None = None
    reference_only: bool = False
    check_finite: bool = True
    warmup_limit: int = 256
    #: specializations warmed at once (``serve.warmup``); 1: one after another. More was not faster on the H200
    #: (24-specialization catalog, round 8: 297 ms on 4 threads vs 190 ms on one)
    warmup_threads: int = 1
    #: with a registry source and no worker processes: keep the state ``tileship rollback`` would return to
    #: loaded and warmed in the background, so a rollback swaps it in without loading (``App.prewarm_rollback``)
    warm_rollback: bool = True
    diagnostics_dir: Path | None = None
    #: serve-time bundles: at most one per reason (500 by exception type) per interval, written off the
    #: event loop; the oldest are deleted past ``diagnostics_keep`` bundles or ``diagnostics_keep_bytes``
    diagnostics_interval_s: float = 60.0
    diagnostics_keep: int = 50
    diagnostics_keep_bytes: int = 512 << 20
    handle_sighup: bool = False
    #: a whole model served next to the operators (``examples.llama.serve.LlamaSpec``; ``--llama``)
    llama: Any = None
    #: test hook: (release path, reference_only) -> Release; default tileship.runtime.loader.load. It is not
    #: given the registry's evidence pin (``holder.Target.evidence``): the default loader checks it
    loader: LoadHook | None = None
    log_stream: TextIO | None = None

    @property
    def grpc_max_request_bytes(self) -> int:
        """The largest request gRPC takes: ``max_body_bytes``, capped at ``grpc_max_message_bytes``."""
        return min(self.max_body_bytes, self.grpc_max_message_bytes)

    def grpc_capped(self) -> str | None:
        """With gRPC on, and ``max_body_bytes`` or ``limits.max_output_bytes`` past ``grpc_max_message_bytes``:
        a sentence saying that gRPC requests and answers stay capped at that limit while REST takes the larger
        ones; else None. Never raises."""
        most = self.grpc_max_message_bytes
        past = [f"{flag} ({n} bytes)" for flag, n in (("--max-body-mib", self.max_body_bytes),
                                                        ("--max-output-mib", self.limits.max_output_bytes))
                if n > most]
        if self.grpc_port is None or not past:
            return None
        return (f"{' and '.join(past)} pass{'es' if len(past) == 1 else ''} gRPC's message limit of {most} bytes: "
                f"gRPC requests and answers are capped at {most} bytes whatever these limits say (a larger request "
                "is refused RESOURCE_EXHAUSTED, a larger answer before its call runs); REST honours the larger "
                "limits, and so does gRPC for tensors passed in shared memory")

    def spin_us(self) -> tuple[float, float]:
        """(worker_spin_us, loop_spin_us) as given, each one not given from ``default_spin_us()``."""
        worker, loop = default_spin_us()
        return (worker if self.worker_spin_us is None else self.worker_spin_us,
                loop if self.loop_spin_us is None else self.loop_spin_us)


#: usable CPUs below which the waits of ``--workers`` sleep at once unless told otherwise: a process that polls
#: holds a core that the front-end, the workers and the clients beside them then lack. Measured with
#: ``benchmarks/serve_workers.py`` (hop p50, polling vs not): the H200 host's 16 cores 8 vs 35 us (round 21);
#: the 2-core CPU machine 22-36 vs 53-65 us when idle (round 31) but 690 vs 319 us while other work ran (round 32)
POLL_MIN_CPUS = 4


def default_spin_us(cpus: int | None = None) -> tuple[float, float]:
    """(worker_spin_us, loop_spin_us) when the flags are not given: (300, 100) with at least ``POLL_MIN_CPUS``
    CPUs usable by this process (``cpus``, default ``os.sched_getaffinity``), else (0, 0): no polling."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return (300.0, 100.0) if cpus >= POLL_MIN_CPUS else (0.0, 0.0)

