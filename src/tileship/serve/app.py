"""The serving state (``Service``): admission control, the inference worker, hot swap, errors.

Request path (``serve.calls.run``, shared with the gRPC endpoint; ``Service.infer`` is its REST
side): Content-Type (415) -> body read, before admission (size limit -> 413,
``body_timeout_s`` -> 408) -> parse + check against the declaration and the request limits
(400, 413 for outputs past ``--max-output-mib``) -> admission (``serve.admission``: at most
``max_inflight`` calls, else 503) -> the operator call on a worker thread (``worker_threads``,
default 1: kernel calls are serialized; on CUDA the stream is synchronized before outputs are copied back) with a
deadline (``request_timeout_s`` -> 504) -> response naming the release, kernel revision,
path and reason. Errors are JSON ``{"error": message}``; a 500 means a bug in tileship or
in an operator's reference, and carries a request id and, when one was written, a
diagnostics id.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.responses import JSONResponse, Response

from tileship.release.diagnostics_queue import CaptureQueue
from tileship.runtime.dispatch import Decision, OpRunner, Release
from tileship.serve import body_pull, calls, extensions, handoff, hot_swap, plans, protocol, shm, staging, validate
from tileship.serve.admission import Slots
from tileship.serve.body import read_pooled, tensors_start
from tileship.serve.config import ServeConfig
from tileship.serve.holder import ReleaseHolder, Served, unpinned
from tileship.serve.jsonlog import JsonLog
from tileship.serve.metrics import ServeMetrics
from tileship.serve.middleware import PartsResponse
from tileship.serve.rollout import Rollout
from tileship.serve.trace import Traces


class Service:
    """State shared by the routes: the holder, metrics, log, worker pool, admission count."""

    def __init__(self, config: ServeConfig, on_fatal: Callable[[str], Any] | None = None) -> None:
        from tileship.runtime import nojit

        self.config = config
        self.log = JsonLog(config.log_stream)
        self.metrics = ServeMetrics(nojit.attempts)
        bind = None
        if config.llama is not None:
            from tileship.extras import llama_example

            bind = llama_example().LlamaHost(config.llama).bind
        self.holder = ReleaseHolder(config.source, unpinned(config.loader) or self._default_loader,
                                    force_reference=config.reference_only, warmup_limit=config.warmup_limit,
                                    warmup_threads=config.warmup_threads, activator_keys=config.trusted_activator_keys,
                                    generation_state=config.generation_state, after_load=self._after_load,
                                    bind_models=bind, registry_id=config.trusted_registry_id)
        # with --workers N, each request thread talks to one worker process at a time
        threads = config.workers or max(1, config.worker_threads)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tileship-infer")
        self.diagnostics = CaptureQueue(config.diagnostics_dir, per_reason_s=config.diagnostics_interval_s,
                                        keep=config.diagnostics_keep, keep_bytes=config.diagnostics_keep_bytes)
        self.slots = Slots(self.pool, config.max_inflight, threads, self.metrics)
        #: runs one admitted call (``calls.execute`` contract): in this process, or in a worker process
        self.executor: Callable[..., Any] = calls.execute
        self.workers: Any = None
        self.inline = handoff.Inline(config.inline_us * 1e-6) if config.inline_us > 0 and not config.workers else None
        if config.workers:
            self._start_pool()
        self.on_fatal = on_fatal
        self._reload_lock, self._loaded = asyncio.Lock(), asyncio.Event()
        self.background: set[asyncio.Task[Any]] = set()  # strong references: the loop keeps only weak ones
        self.prewarming: asyncio.Task[Any] | None = None  # loading the rollback standby (``serve.standby``)
        self.canary = Rollout(self)  # a second release taking a share of requests (serve.rollout)
        self.stats = extensions.ModelStats()  # Triton statistics per (model, version), fed on the loop
        self.traces = Traces(self.log)  # Triton's trace settings, and the traces they ask for (serve.trace)
        self.staging = staging.Pool()  # reused (pinned) blocks for large request bodies (serve.staging)
        self.pulls = body_pull.Pulls(config.body_threads)  # threads reading large bodies (serve.body_pull)
        self.plans = plans.Plans()  # kept plans of recurring request signatures (serve.plans)
        self.unloaded: set[str] = set()  # models unloaded through the repository extension
        # Triton's system and CUDA shared-memory regions (serve.shm), closed at shutdown. With worker
        # processes the GPU is theirs: this process opens no CUDA IPC handle
        self.shm = shm.Regions(cuda_off="it runs with --workers N, where worker processes own the GPU; "
                                        "serve with --workers 0 for CUDA shared memory" if config.workers else None)
        self.grpc_port: int | None = None  # the bound gRPC port, while the gRPC endpoint listens

    def _start_pool(self) -> None:
        from tileship.errors import DeclarationError
        from tileship.serve.remote import execute_remote
        from tileship.serve.worker_pool import WorkerPool

        c = self.config
        if c.llama is not None:
            raise DeclarationError("--llama is not served with --workers yet", hint="drop --workers (or --llama)")
        worker_spin_us, loop_spin_us = c.spin_us()
        options = {"trusted_keys": [str(k) for k in c.trusted_keys] if c.trusted_keys is not None else None,
                   "drift_policy": c.drift_policy, "allow_unverified": c.allow_unverified,
                   "check_finite": c.check_finite, "warmup_limit": c.warmup_limit,
                   "warmup_threads": c.warmup_threads, "spin_us": worker_spin_us, "loop_spin_us": loop_spin_us}
        if c.gpus:
            import torch

            from tileship.serve import gpu_map

            gpu_map.check_visible(c.gpus, torch.cuda.device_count())
        self.workers = WorkerPool(c.workers, options, log=self.log, registry=self.metrics.registry,
                                  timeout_s=c.worker_timeout_s or c.request_timeout_s, gpus=c.gpus)
        self.executor = execute_remote

    # -- loading -------------------------------------------------------------------------
    def _default_loader(self, path: Path, reference_only: bool, evidence: str | None) -> Release:
        from tileship.runtime.loader import load

        c = self.config
        return load(path, trusted_keys=c.trusted_keys, drift_policy=c.drift_policy, allow_unverified=c.allow_unverified,
                    reference_only=reference_only, expect_evidence_digest=evidence)

    def _after_load(self, release: Release) -> str | None:
        """Arm the circuit breaker (non-finite checks, diagnostics per trip) and write a
        diagnostics bundle for load failures or drift; returns its id. Without the
        diagnostics module the breaker still works, just without bundles."""
        for runner in release.ops.values():
            if isinstance(runner, OpRunner):
                runner.check_finite = self.config.check_finite
        try:
            from tileship.release import diagnostics
        except ImportError:
            return None
        diagnostics.watch(release, check_finite=self.config.check_finite, out_dir=self.config.diagnostics_dir,
                          also=lambda entry, reason, detail, ref: self._circuit_open(release, entry, detail, ref.id))
        ref = diagnostics.check_release(release, out_dir=self.config.diagnostics_dir)
        return ref.id if ref is not None else None

    def _circuit_open(self, release: Release, entry: Any, detail: str, diag_id: str | None) -> None:
        op = entry.spec.op if entry.spec is not None else "?"
        self.metrics.circuit_open.labels(op, release.release_id).inc()
        self.log.event("circuit_open", "warning", model=op, version=release.release_id, spec=entry.decision.spec_id,
                       detail=detail, diagnostics_id=diag_id)

    async def initial_load(self) -> None:
        try:
            await hot_swap.load_and_swap(self, trigger="startup", accept_warm_failures=True)
            if self.workers is not None and (cur := self.holder.current) is not None:
                # the workers load exactly what the front-end resolved (a registry may move meanwhile)
                self.workers.start(cur.target, cur.release_id)
        finally:
            self._loaded.set()

    async def reload(self, trigger: str) -> tuple[int, dict[str, Any]]:
        """Re-read the source; swap only a release that loaded and warmed cleanly. One at a time."""
        await self._loaded.wait()
        if self.holder.fatal is not None:
            return 503, {"result": "failed", "stage": "fatal",
                         "error": f"the process is exiting after a device failure ({self.holder.fatal})"}
        return await hot_swap.load_and_swap(self, trigger=trigger, accept_warm_failures=self.holder.current is None)

    def poison(self, reason: str) -> None:
        if self.holder.fatal is not None:
            return
        self.holder.poison(reason)
        self.metrics.ready.set(0)
        self.log.event("fatal", "critical", reason=reason, action="exiting so the supervisor restarts the process")
        if self.on_fatal is not None:
            self.on_fatal(reason)

    # -- inference ---------------------------------------------------------------------------
    async def infer(self, request: Any) -> Any:
        """POST /v2/models/{name}[/versions/{version}]/infer: REST's ``calls.run`` (``request``: also ``Incoming``)."""
        rid = request.scope["tileship.request_id"]
        header_length = request.headers.get(protocol.HEADER_LENGTH)

        async def read() -> tuple[protocol.InferRequest, int]:
            protocol.check_content_type(request.headers.get("content-type"), header_length)
            # the body first, outside admission: a slow client holds its own connection, never an inference slot.
            # A large one lands in a reused (pinned) block, given back by ``calls.run`` once the call has ended
            data, lease = await read_pooled(request, self.staging, limit=self.config.max_body_bytes,
                                            timeout_s=self.config.body_timeout_s, rejected=self.metrics.rejected,
                                            align_at=tensors_start(header_length), pulls=self.pulls,
                                            encoding=request.headers.get("content-encoding"))
            try:
                req = protocol.parse_infer(data, header_length, self.config.limits)
            except BaseException:
                if lease is not None:
                    lease.give_back()
                raise
            req.lease = lease
            return req, len(data)

        def on_served(served: Served) -> None:
            request.scope["tileship.served"] = served

        call = calls.Call(request.path_params["name"], request.path_params.get("version"), rid, read,
                          protocol.encode_response, lambda e: e.size, "rest", on_served)
        answer = await calls.run(self, call)
        if answer.status != 200:
            body = {"error": answer.message, **({"diagnostics_id": d} if (d := answer.diagnostics_id) else {})}
            retry = {"retry-after": "1"} if answer.status == 503 else None
            return JSONResponse(body, status_code=answer.status, headers=retry)
        encoded, decision = answer.encoded, answer.decision
        assert answer.served is not None and decision is not None
        headers = self._release_headers(answer.served, decision, rid)
        if encoded.header_length is not None:
            headers.append((b"inference-header-content-length", str(encoded.header_length).encode()))
            media = b"application/octet-stream"
        else:
            media = b"application/json"
        return PartsResponse(200, encoded.parts, media, headers, complete=True)

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """The holder's readiness, and not ready while every worker thread runs a call past its deadline."""
        ok, body = self.holder.readiness()
        if (canary := self.canary.summary()) is not None:
            body["canary"] = canary
        if self.workers is not None:
            body["workers"] = self.workers.status()
            if ok and not (wok := self.workers.readiness())[0]:
                return False, {**body, "ready": False, "reason": f"not ready: {wok[1]}"}
        why = self.slots.wedged() if ok else None
        return (False, {**body, "ready": False, "reason": why}) if why else (ok, body)

    def capture(self, served: Served | None, exc: BaseException, call: Any = None) -> str | None:
        """Queue a bundle (off the event loop, one per reason a minute); its id, or None when none is written."""
        try:
            detail = validate.short(f"{type(exc).__name__}: {exc}", 500)
            return self.diagnostics.submit(f"serve_error:{type(exc).__name__}", served.release if served else None,
                                           exc=exc, call=call, detail=detail)
        except Exception:  # diagnostics must never mask the original error
            return None

    def log_internal(self, rid: str, exc: BaseException, model: str = "_unknown",
                     served: Served | None = None) -> tuple[str, str | None]:
        """Log a bug with its traceback and queue a bundle.

        Returns (the client's message naming the request id, the diagnostics id)."""
        diag = self.capture(served, exc)
        what = validate.short(f"{type(exc).__name__}: {exc}", 300)
        self.log.event("error", "error", request_id=rid, model=model, error=what,
                       traceback="".join(traceback.format_exception(exc)), diagnostics_id=diag)
        return f"internal error ({what}); request id {rid}" + (f"; diagnostics {diag}" if diag else ""), diag

    def internal_error(self, rid: str, exc: BaseException) -> Response:
        """The REST catch-all outside inference: a logged 500 naming the request id (and the diagnostics bundle)."""
        msg, diag = self.log_internal(rid, exc)
        return JSONResponse({"error": msg, **({"diagnostics_id": diag} if diag else {})}, status_code=500)

    def count_error(self, status: int, message: str, call: calls.Call, labels: list[str], t0: float,
                    kserve_id: str | None) -> None:
        """An inference request answered with an error: metrics, statistics, one log line."""
        self.metrics.requests.labels(labels[0], labels[1], labels[2], str(status)).inc()
        if labels[0] != "_unknown":
            self.stats.record(labels[0], labels[1], False, time.perf_counter() - t0)
        self.metrics.latency.labels(labels[0], labels[1], labels[2]).observe(time.perf_counter() - t0)
        self.log.event("infer", "warning" if status < 500 else "error", request_id=call.request_id, id=kserve_id,
                       model=labels[0], version=labels[1], status=status, protocol=call.protocol, path="none",
                       error=message, ms=round((time.perf_counter() - t0) * 1e3, 3))

    def _release_headers(self, served: Served, decision: Decision, rid: str) -> list[tuple[bytes, bytes]]:
        rel = served.release  # with every header ``RequestIds`` adds: sent as it is (``PartsResponse.complete``)
        h = [(b"x-tileship-release", rel.release_id.encode()),
             (b"x-tileship-kernel-revision", rel.kernel_revision.encode()),
             (b"x-tileship-path", decision.path.encode()), (b"x-tileship-reason", decision.reason.encode()),
             (b"x-request-id", rid.encode()),
             (b"x-tileship-evidence", getattr(rel, "evidence_digest", "none").encode())]
        if decision.spec_id:
            h.append((b"x-tileship-spec", decision.spec_id.encode()))
        return h
