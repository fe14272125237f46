"""A replica of the ``tileship serve --ray`` fleet: the ``tileship serve`` app on the release the
fleet's controller assigns it (``serve.ray_fleet``).

``FleetReplica`` is wrapped with ``@serve.ingress`` by ``serve.ray_fleet.Fleet``; Ray Serve calls
``__serve_build_asgi_app__`` after the constructor and routes no request to the replica before it
returns, so the release is loaded (no JIT) and warmed first. Every ``poll_s`` the replica syncs
with the controller: it sends the version it serves (``fleet_plan.version_of``: the release id, the registry's
copy and the evidence pin), load failures per version and one sample per answered inference request, and gets
back the release to serve, its copy, its evidence pin and whether it serves reference-only; a different release,
or the same one in another copy, with another pin or in the other mode, is hot-swapped in with ``Service.reload``
(loaded and warmed off to the side; requests in flight finish on theirs). The controller assigns a new version to
one canary replica first, the rest after it passed (a reference-only one to all at once); a replica whose reload
fails keeps serving what it served.
Ray is imported only inside the replica process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

from tileship.serve.config import ServeConfig
from tileship.serve.fleet_plan import version_of

CONTROLLER = "tileship-fleet"
NAMESPACE = "tileship"
MAX_SAMPLES = 20000      # per replica between two syncs (a stalled controller must not grow a replica's memory)


class FleetReplica:
    """One replica: the ``tileship serve`` app on the release the controller assigns it."""

    def __init__(self, config: ServeConfig, poll_s: float) -> None:
        self.config, self.poll_s = config, poll_s
        self.samples: list[list[Any]] = []
        self.failed: dict[str, str] = {}      # version -> why it could not load (sent once)
        #: (release, copy, evidence pin, reference-only) that failed to load while still assigned (not tried again
        #: until the assignment changes: another release, or the same one in another copy, pin or mode)
        self.tried: set[tuple[str, str, str | None, bool]] = set()
        self.loading: str | None = None
        self.service: Any = None

    async def __serve_build_asgi_app__(self) -> Any:
        import ray
        from ray import serve

        from tileship.serve.routes import create_app

        self.id = serve.get_replica_context().replica_id.unique_id
        self.node = ray.util.get_node_ip_address()
        self.controller = ray.get_actor(CONTROLLER, namespace=NAMESPACE)
        want = await self.controller.sync.remote(self.id, self._report())
        source = Path(want["path"]) if want["path"] else self.config.source
        app = create_app(dataclasses.replace(self.config, source=source, generation_state=None))  # the controller's
        self.service = app.state.service
        if want["path"]:  # the registry's copy of that release, with the evidence pinned when it was activated
            self.service.holder.follow(source, want["release"], want.get("evidence"), bool(want.get("reference_only")))
        await self.service.initial_load()  # loaded and warmed before Ray Serve routes a request here
        self.task = asyncio.create_task(self._sync_loop())
        return _Recorder(app, self._record, self.controller)

    def check_health(self) -> None:
        """Ray Serve restarts a replica whose process is poisoned (a sticky device error)."""
        if self.service is not None and self.service.holder.fatal is not None:
            raise RuntimeError(f"device failure: {self.service.holder.fatal}")

    def _record(self, model: str, release: str, seconds: float, error: bool) -> None:
        if len(self.samples) < MAX_SAMPLES:
            self.samples.append([model, release, seconds, error])

    def _report(self) -> dict[str, Any]:
        cur = self.service.holder.current if self.service is not None else None
        samples, self.samples = self.samples, []
        failed, self.failed = self.failed, {}
        version = version_of(cur.release_id, str(cur.target.path), cur.target.evidence,
                             cur.target.reference_only) if cur is not None else None
        return {"version": version, "failed": failed, "samples": samples, "node": getattr(self, "node", "")}

    async def _sync_loop(self) -> None:
        while True:
            report = self._report()
            try:
                want = await self.controller.sync.remote(self.id, report)
                self._follow(want["release"], want["path"], want.get("evidence"), bool(want.get("reference_only")))
            except Exception as exc:  # the controller restarting: keep serving what is loaded
                self.failed.update(report["failed"])  # a load failure must reach it (samples may be lost)
                self.service.log.event("fleet_sync_failed", "warning", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self.poll_s)

    def _follow(self, release: str | None, path: str | None, evidence: str | None = None,
                reference_only: bool = False) -> None:
        """Load ``release`` from the registry's copy at ``path`` with ``evidence`` pinned, reference-only or not, when
        any of the four is not what serves (the same release re-pinned by activating it again, a new copy of it from
        ``publish --replace``, or activated with or without ``--reference``), as a server following the registry
        reloads for any change of its target (``holder.unchanged``)."""
        holder = self.service.holder
        cur = holder.current
        serving = (cur.release_id, cur.target.path, cur.target.evidence, cur.target.reference_only) \
            if cur is not None else None
        want_ref = reference_only or holder.force_reference  # a --reference-only replica serves nothing else
        if release is None or path is None or serving == (release, Path(path), evidence, want_ref):
            self.tried.clear()
            return
        if (release, path, evidence, reference_only) in self.tried or self.loading is not None:
            return
        self.loading = release
        task = asyncio.create_task(self._load(release, Path(path), evidence, reference_only))
        self.service.background.add(task)
        task.add_done_callback(self.service.background.discard)

    async def _load(self, release: str, path: Path, evidence: str | None = None, reference_only: bool = False) -> None:
        holder = self.service.holder
        before = holder.current
        try:
            holder.follow(path, release, evidence, reference_only)
            status, body = await self.service.reload(trigger="fleet")
            if status != 200:
                self.tried.add((release, str(path), evidence, reference_only))
                self.failed[version_of(release, str(path), evidence, reference_only)] = \
                    f"{body.get('stage')}: {body.get('error')}"
                if before is not None:  # a reload by hand (SIGHUP, /v2/repository/reload) re-reads what serves
                    holder.follow(before.target.path, before.target.release_id, before.target.evidence,
                                  before.target.reference_only)
        finally:
            self.loading = None


class _Recorder:
    """ASGI wrapper: one sample per inference request a release answered (model, release, seconds,
    error). An error is a 5xx other than 503 or a kernel fault the reference answered (reason
    ``circuit_open``), as ``serve.canary`` counts; a 4xx (the request's fault) and a 503 (overload,
    not ready: the fleet's, not the release's) are not samples.
    ``GET /v2/tileship/fleet`` answers the controller's status (any replica answers it)."""

    def __init__(self, app: Any, record: Any, controller: Any) -> None:
        self.app, self.record, self.controller = app, record, controller

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v2/tileship/fleet" and scope["method"] == "GET":
            from starlette.responses import JSONResponse

            await JSONResponse(await self.controller.status.remote())(scope, receive, send)
            return
        if scope["type"] != "http" or not scope["path"].endswith("/infer"):
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        seen: dict[str, Any] = {}

        async def watch(message: Any) -> None:
            if message["type"] == "http.response.start":
                seen["status"], seen["headers"] = message["status"], dict(message.get("headers") or [])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            headers = seen.get("headers", {})
            release = headers.get(b"x-tileship-release", b"none").decode()
            parts = scope["path"].split("/")
            status = seen.get("status", 500)
            # 4xx (the request's fault) and 503 (overload, not ready) say nothing about the release
            if release != "none" and len(parts) > 3 and not 400 <= status < 500 and status != 503:
                error = status >= 500 or headers.get(b"x-tileship-reason") == b"circuit_open"
                self.record(parts[3], release, time.perf_counter() - t0, error)
