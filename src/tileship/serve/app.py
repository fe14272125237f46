"""The serving state (``Service``): admission control, the inference worker, hot swap, errors.

Request path: Content-Type (415) -> body read, before admission (size limit -> 413,
``body_timeout_s`` -> 408) -> parse + check against the declaration and the request limits
(400, 413 for outputs past ``--max-output-mib``) -> admission (``serve.admission``: at most
``max_inflight`` calls, else 503) -> the operator call on a worker thread (``worker_threads``, default 1: kernel calls are
serialized; on CUDA the stream is synchronized before outputs are copied back) with a
deadline (``request_timeout_s`` -> 504) -> response naming the release, kernel revision,
path and reason. Errors are JSON ``{"error": message}``; a 500 means a bug in tileship or
in an operator's reference, and carries a request id and, when one was written, a
diagnostics id.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tileship.errors import CallError
from tileship.release.diagnostics_queue import CaptureQueue
from tileship.runtime.device_faults import is_sticky_fault
from tileship.runtime.dispatch import REFERENCE, Decision, OpRunner, Release
from tileship.serve import extensions, protocol, validate
from tileship.serve.admission import Slots
from tileship.serve.body import read_body
from tileship.serve.canary_stats import Timed
from tileship.serve.config import ServeConfig
from tileship.serve.holder import ReleaseHolder, Served, Target, image_check, release_id_at
from tileship.serve.jsonlog import JsonLog
from tileship.serve.metrics import ServeMetrics
from tileship.serve.middleware import PartsResponse
from tileship.serve.protocol import BadRequest
from tileship.serve.rollout import Rollout


class _Fatal(Exception):
    pass


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
        self.holder = ReleaseHolder(config.source, config.loader or self._default_loader, force_reference=config.reference_only,
                                    warmup_limit=config.warmup_limit, after_load=self._after_load, bind_models=bind)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, config.worker_threads), thread_name_prefix="tileship-infer")
        self.diagnostics = CaptureQueue(config.diagnostics_dir, per_reason_s=config.diagnostics_interval_s,
                                        keep=config.diagnostics_keep, keep_bytes=config.diagnostics_keep_bytes)
        self.slots = Slots(self.pool, config.max_inflight, config.worker_threads, self.metrics)
        self.on_fatal = on_fatal
        self._reload_lock = asyncio.Lock()
        self._loaded = asyncio.Event()
        self.background: set[asyncio.Task[Any]] = set()  # strong references: the loop keeps only weak ones
        self.canary = Rollout(self)  # a second release taking a share of requests (serve.rollout)
        self.stats = extensions.ModelStats()  # Triton statistics per (model, version), fed on the loop
        self.unloaded: set[str] = set()  # models unloaded through the repository extension

    # -- loading -------------------------------------------------------------------------
    def _default_loader(self, path: Path, reference_only: bool) -> Release:
        from tileship.runtime.loader import load

        c = self.config
        return load(path, trusted_keys=c.trusted_keys, drift_policy=c.drift_policy, allow_unverified=c.allow_unverified,
                    reference_only=reference_only)

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
            await self._load_and_swap(trigger="startup", accept_warm_failures=True)
        finally:
            self._loaded.set()

    async def reload(self, trigger: str) -> tuple[int, dict[str, Any]]:
        """Re-read the source; swap only a release that loaded and warmed cleanly. One at a time."""
        await self._loaded.wait()
        if self.holder.fatal is not None:
            return 503, {"result": "failed", "stage": "fatal", "error": f"the process is exiting after a device failure ({self.holder.fatal})"}
        return await self._load_and_swap(trigger=trigger, accept_warm_failures=self.holder.current is None)

    async def _load_and_swap(self, *, trigger: str, accept_warm_failures: bool) -> tuple[int, dict[str, Any]]:
        async with self._reload_lock:
            h = self.holder
            cur = h.current
            try:
                target: Target = await asyncio.to_thread(h.resolve)
            except Exception as exc:
                return self._failed(str(h.source), "resolve", exc, trigger)
            rid = release_id_at(target.path)
            if cur is not None and rid == cur.release_id and target.reference_only == cur.target.reference_only:
                self.metrics.reloads.labels("unchanged").inc()
                self.log.event("reload", trigger=trigger, result="unchanged", release=rid)
                return 200, {"result": "unchanged", "release": rid, "reference_only": target.reference_only}
            self.log.event("load_start", trigger=trigger, source=str(target.path), release=rid, reference_only=target.reference_only)
            try:
                served = await asyncio.to_thread(h.prepare, target)
            except Exception as exc:
                return self._failed(str(target.path), "load", exc, trigger)
            for sid in served.warm.failures:
                self.metrics.warmup_failures.labels(sid.split(".", 1)[0]).inc()
            if served.warm.failures and not accept_warm_failures:
                detail = "; ".join(f"{s}: {e}" for s, e in sorted(served.warm.failures.items()))
                return self._failed(str(target.path), "warmup", f"warm-up failed for {len(served.warm.failures)} specializations: {detail}",
                                    trigger, stage_metric="warmup")
            old = h.swap(served)
            m = self.metrics
            m.load_seconds.set(served.load_seconds)
            m.warmup_seconds.set(served.warm.seconds)
            rel = served.release
            image = image_check(rel)
            m.set_release(rel.release_id, rel.kernel_revision, rel.lock_digest, served.device_label, image,
                          evidence=rel.evidence_seal)
            if image["mismatch"]:
                self.log.event("image_digest_mismatch", "warning", release=rel.release_id, **image)
            ready, body = h.readiness()
            m.ready.set(1 if ready else 0)
            self.log.event("swap" if old is not None else "ready", trigger=trigger, release=rel.release_id, previous=old.release_id if old else None,
                           kernel_revision=rel.kernel_revision, load_s=round(served.load_seconds, 4), warmup_s=round(served.warm.seconds, 4),
                           warmup_calls=served.warm.calls, warmup_failures=served.warm.failures, reason=body["reason"],
                           notes=list(rel.notes), diagnostics_id=served.diagnostics_id)
            m.reloads.labels("swapped").inc()
            return 200, {"result": "swapped", "release": rel.release_id, "previous": old.release_id if old else None,
                         "reference_only": served.target.reference_only, "load_seconds": served.load_seconds,
                         "warmup_seconds": served.warm.seconds, "warmup_failures": served.warm.failures}

    def _failed(self, source: str, stage: str, error: BaseException | str, trigger: str, stage_metric: str = "load") -> tuple[int, dict[str, Any]]:
        fail = self.holder.fail(source, stage, error)
        self.metrics.load_failures.labels(stage_metric).inc()
        self.metrics.reloads.labels("failed").inc()
        self.metrics.ready.set(1 if self.holder.readiness()[0] else 0)
        cur = self.holder.current
        tb = traceback.format_exception(error) if isinstance(error, BaseException) and not hasattr(error, "hint") else None
        self.log.event("load_failed", "error", trigger=trigger, source=source, stage=stage, error=fail["error"], hint=fail["hint"],
                       serving=cur.release_id if cur else None, traceback="".join(tb) if tb else None)
        return 409, {"result": "failed", "error": fail["error"], "stage": stage, "hint": fail["hint"],
                     "serving": cur.release_id if cur else None}

    def poison(self, reason: str) -> None:
        if self.holder.fatal is not None:
            return
        self.holder.poison(reason)
        self.metrics.ready.set(0)
        self.log.event("fatal", "critical", reason=reason, action="exiting so the supervisor restarts the process")
        if self.on_fatal is not None:
            self.on_fatal(reason)

    # -- inference ---------------------------------------------------------------------------
    async def infer(self, request: Request) -> Any:
        t0 = time.perf_counter()
        rid = request.scope["tileship.request_id"]
        name = request.path_params["name"]
        version = request.path_params.get("version")
        served, side = self.canary.route(self.holder.current, name)
        labels = ["_unknown", "", "none"]
        kserve_id = None
        try:
            if served is None or self.holder.fatal is not None:
                raise BadRequest(503, f"not ready: {self.holder.readiness()[1]['reason']}")
            request.scope["tileship.served"] = served
            rel = served.release
            runner = rel.ops.get(name)
            whole = served.models.get(name)
            if runner is None and whole is None:
                raise BadRequest(404, f"unknown model {validate.short(name)}: this release serves {', '.join(sorted([*rel.ops, *served.models]))}")
            labels[:2] = [name, rel.release_id]
            if version is not None and version != rel.release_id:
                raise BadRequest(404, f"unknown version {validate.short(version)} of model {name}: serving version {rel.release_id}")
            if name in self.unloaded:
                raise BadRequest(400, extensions.unloaded_error(name))
            protocol.check_content_type(request.headers.get("content-type"), request.headers.get(protocol.HEADER_LENGTH))
            # the body first, outside admission: a slow client holds its own connection, never an inference slot
            data = await read_body(request, limit=self.config.max_body_bytes, timeout_s=self.config.body_timeout_s,
                                   rejected=self.metrics.rejected)
            t_body = time.perf_counter()
            req = protocol.parse_infer(data, request.headers.get(protocol.HEADER_LENGTH), self.config.limits)
            kserve_id = req.id
            if whole is not None:
                job: Callable[[], Any] = functools.partial(self._execute_model, served, whole, whole.plan(req), req.id)
            else:
                decl = rel.declarations[name]
                plan = protocol.plan_call(req, name, decl)
                if not plan.declared and self.config.strict_shapes:
                    dims = ", ".join(f"{d}={v}" for d, v in plan.dims.items())
                    raise BadRequest(400, f"shape outside the declared set: {dims} (declared: {protocol.declared_shapes_text(decl)}); "
                                          "this server runs with --strict-shapes")
                validate.check_outputs(name, protocol.output_bytes(decl, plan), self.config.limits)
                job = functools.partial(self._execute, served, name, plan, req.id)
            t_submit = time.perf_counter()
            fut = self.slots.submit(timed := Timed(job))
            try:
                encoded, decision = await asyncio.wait_for(asyncio.wrap_future(fut), self.config.request_timeout_s)
                t_run = time.perf_counter()
            except TimeoutError:
                self.metrics.rejected.labels("timeout").inc()
                self.slots.timed_out(fut)
                raise BadRequest(504, f"timeout: the inference did not finish within {self.config.request_timeout_s:g} s") from None
        except BadRequest as exc:
            self.canary.record(side, name, exc.status)
            return self._error(exc.status, exc.message, rid, labels, t0, kserve_id)
        except _Fatal as exc:
            self.canary.record(side, name, 503, reason="device_failure")
            return self._error(503, f"device failure: {exc}; this process is exiting so its supervisor restarts it", rid, labels, t0, kserve_id)
        except Exception as exc:  # a bug: answer 500 with ids, never crash the server
            self.canary.record(side, name, 500)
            return self.internal_error(rid, exc, labels, t0, kserve_id, served)
        labels[2] = decision.path
        status = 200
        self.canary.record(side, name, status, timed.seconds, decision.reason)
        elapsed = time.perf_counter() - t0
        m = self.metrics
        m.requests.labels(labels[0], labels[1], decision.path, "200").inc()
        m.latency.labels(labels[0], labels[1], decision.path).observe(elapsed)
        if decision.path == REFERENCE:
            m.fallbacks.labels(labels[0], labels[1], decision.reason).inc()
        headers = self._release_headers(served, decision, rid)
        if encoded.header_length is not None:
            headers.append((b"inference-header-content-length", str(encoded.header_length).encode()))
            media = b"application/octet-stream"
        else:
            media = b"application/json"
        self.log.event("infer", request_id=rid, id=kserve_id, model=name, version=labels[1], status=status, path=decision.path,
                       reason=decision.reason, spec=decision.spec_id, ms=round(elapsed * 1e3, 3),
                       body_ms=round((t_body - t0) * 1e3, 3), run_ms=round((t_run - t_body) * 1e3, 3), bytes_in=len(data), bytes_out=encoded.size)
        t_end = time.perf_counter()
        run_s = timed.seconds or 0.0
        self.stats.record(name, labels[1], True, t_end - t0, t_submit - t0, t_run - t_submit - run_s, run_s, t_end - t_run)
        return PartsResponse(status, encoded.parts, media, headers)

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """The holder's readiness, and not ready while every worker thread runs a call past its deadline."""
        ok, body = self.holder.readiness()
        if (canary := self.canary.summary()) is not None:
            body["canary"] = canary
        why = self.slots.wedged() if ok else None
        return (False, {**body, "ready": False, "reason": why}) if why else (ok, body)

    def _execute(self, served: Served, name: str, plan: protocol.CallPlan, kserve_id: str | None) -> tuple[protocol.Encoded, Decision]:
        """On a worker thread: tensors -> call -> sync -> CPU -> encoded response."""
        rel = served.release
        runner = rel.ops[name]
        device = served.devices[name]
        tensors = plan.arguments(device)
        try:
            out, decision = runner.call(*tensors)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            if device != "cpu":
                import torch

                torch.cuda.current_stream().synchronize()
            host = [o.detach().cpu() for o in outs]
        except CallError as exc:
            raise BadRequest(400, exc.message) from None
        except Exception as exc:
            if is_sticky_fault(exc, device):
                diag = self._capture(served, exc, tensors)
                self.poison(f"{type(exc).__name__}: {str(exc).splitlines()[0]}" + (f" (diagnostics {diag})" if diag else ""))
                raise _Fatal(f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
            raise
        out_names = [n for n, _ in rel.declarations[name]["outputs"]]
        params = {"tileship_release": rel.release_id, "tileship_kernel_revision": rel.kernel_revision,
                  "tileship_path": decision.path, "tileship_reason": decision.reason}
        if decision.spec_id:
            params["tileship_spec"] = decision.spec_id
        outputs = [(n, host[out_names.index(n)], binary) for n, binary in plan.outputs]
        return protocol.encode_response(model=name, version=rel.release_id, request_id=kserve_id, parameters=params, outputs=outputs,
                                        allow_nonfinite=plan.allow_nonfinite), decision

    def _execute_model(self, served: Served, whole: Any, plan: tuple[protocol.InputTensor, bool], kserve_id: str | None) -> tuple[protocol.Encoded, Decision]:
        """On a worker thread: a whole model's forward (``examples/llama/serve.py``), errors handled as in ``_execute``."""
        inp, binary = plan
        try:
            logits, decision, dispatch = whole.run(inp)
            if whole.device != "cpu":
                import torch

                torch.cuda.current_stream().synchronize()
            host = logits.detach().cpu()
        except CallError as exc:
            raise BadRequest(400, exc.message) from None
        except Exception as exc:
            if is_sticky_fault(exc, whole.device):
                diag = self._capture(served, exc)
                self.poison(f"{type(exc).__name__}: {str(exc).splitlines()[0]}" + (f" (diagnostics {diag})" if diag else ""))
                raise _Fatal(f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
            raise
        rel = served.release
        params = {"tileship_release": rel.release_id, "tileship_kernel_revision": rel.kernel_revision,
                  "tileship_path": decision.path, "tileship_reason": decision.reason, **dispatch}
        return protocol.encode_response(model=whole.spec.name, version=rel.release_id, request_id=kserve_id, parameters=params,
                                        outputs=[(whole.output, host, binary)]), decision

    def _capture(self, served: Served | None, exc: BaseException, call: Any = None) -> str | None:
        """Queue a bundle (off the event loop, one per reason a minute); its id, or None when none is written."""
        try:
            return self.diagnostics.submit(f"serve_error:{type(exc).__name__}", served.release if served else None,
                                           exc=exc, call=call, detail=validate.short(f"{type(exc).__name__}: {exc}", 500))
        except Exception:  # diagnostics must never mask the original error
            return None

    def internal_error(self, rid: str, exc: BaseException, labels: list[str] | None = None, t0: float | None = None,
                       kserve_id: str | None = None, served: Served | None = None) -> Response:
        """The catch-all: a logged 500 naming the request id (and the diagnostics bundle, when one is queued)."""
        diag = self._capture(served, exc)
        what = validate.short(f"{type(exc).__name__}: {exc}", 300)
        self.log.event("error", "error", request_id=rid, model=(labels or ["_unknown"])[0], error=what,
                       traceback="".join(traceback.format_exception(exc)), diagnostics_id=diag)
        msg = f"internal error ({what}); request id {rid}" + (f"; diagnostics {diag}" if diag else "")
        if labels is None:
            return JSONResponse({"error": msg, **({"diagnostics_id": diag} if diag else {})}, status_code=500)
        return self._error(500, msg, rid, labels, t0 or time.perf_counter(), kserve_id, diagnostics_id=diag)

    def _error(self, status: int, message: str, rid: str, labels: list[str], t0: float, kserve_id: str | None,
               diagnostics_id: str | None = None) -> Response:
        self.metrics.requests.labels(labels[0], labels[1], labels[2], str(status)).inc()
        if labels[0] != "_unknown":
            self.stats.record(labels[0], labels[1], False, time.perf_counter() - t0)
        self.metrics.latency.labels(labels[0], labels[1], labels[2]).observe(time.perf_counter() - t0)
        self.log.event("infer", "warning" if status < 500 else "error", request_id=rid, id=kserve_id, model=labels[0], version=labels[1],
                       status=status, path="none", error=message, ms=round((time.perf_counter() - t0) * 1e3, 3))
        body: dict[str, Any] = {"error": message}
        if diagnostics_id:
            body["diagnostics_id"] = diagnostics_id
        headers = {"retry-after": "1"} if status == 503 else None
        return JSONResponse(body, status_code=status, headers=headers)

    def _release_headers(self, served: Served, decision: Decision, rid: str) -> list[tuple[bytes, bytes]]:
        rel = served.release
        h = [(b"x-tileship-release", rel.release_id.encode()), (b"x-tileship-kernel-revision", rel.kernel_revision.encode()),
             (b"x-tileship-path", decision.path.encode()), (b"x-tileship-reason", decision.reason.encode())]
        if decision.spec_id:
            h.append((b"x-tileship-spec", decision.spec_id.encode()))
        return h


