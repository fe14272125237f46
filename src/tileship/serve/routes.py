"""The ASGI app (create_app): the KServe v2 routes over a Service, lifespan, middleware."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tileship import __version__, env
from tileship.serve import canary_http, extensions, log_settings, openapi, shm_http, trace
from tileship.serve.app import Service
from tileship.serve.config import ServeConfig
from tileship.serve.holder import Served, image_check
from tileship.serve.middleware import RequestIds
from tileship.serve.telemetry import ReferenceCollector
from tileship.serve.validate import clip, short


def create_app(config: ServeConfig, *, on_fatal: Callable[[str], Any] | None = None) -> Any:
    """The ASGI app. Loading starts when the app starts (lifespan) and runs in the
    background: liveness answers at once, readiness once the release is loaded and warm."""
    service = Service(config, on_fatal=on_fatal)
    service.metrics.registry.register(ReferenceCollector(
        lambda: cur.release if (cur := service.holder.current) is not None else None))

    def served_or(status: int) -> Served:
        cur = service.holder.current
        if cur is None:
            raise HTTPException(status, f"not ready: {service.holder.readiness()[1]['reason']}")
        return cur

    def model(request: Request) -> tuple[Served, str]:
        cur = served_or(503)
        name = request.path_params["name"]
        if name not in cur.release.ops and name not in cur.models:
            raise HTTPException(404,
                                f"unknown model {short(name)}: this release serves "
                                f"{', '.join(sorted([*cur.release.ops, *cur.models]))}")
        version = request.path_params.get("version")
        if version is not None and version != cur.release_id:
            raise HTTPException(404,
                                f"unknown version {short(version)} of model {name}: serving version {cur.release_id}")
        request.scope["tileship.served"] = cur
        return cur, name

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> Response:
        ok, body = service.readiness()
        if service.unloaded:
            body["unloaded"] = sorted(service.unloaded)
        return JSONResponse(body, status_code=200 if ok else 503)

    async def server_metadata(request: Request) -> Response:
        cur = service.holder.current
        image = image_check(cur.release) if cur is not None else {"running": env.image_digest()}
        # the release id with the evidence digest in effect: two servers with other evidence differ here
        release = {"id": cur.release_id, "evidence_digest": cur.release.evidence_digest,
                   "evidence": cur.release.evidence_seal.to_json() if cur.release.evidence_seal else None} \
            if cur is not None else None
        return JSONResponse({"name": "tileship", "version": __version__,
                             "extensions": extensions.claimed(service), "image": image, "release": release})

    async def model_metadata(request: Request) -> Response:
        cur, name = model(request)
        extensions.check_loaded(service, name, request.path_params.get("version"))
        return JSONResponse(extensions.model_metadata(service, cur, name))

    async def model_ready(request: Request) -> Response:
        cur, name = model(request)
        ok, body = service.readiness()
        if ok and name in service.unloaded:
            ok, body = False, {"reason": extensions.unloaded_error(name)}
        return JSONResponse({"name": name, "version": cur.release_id, "ready": ok, "reason": body["reason"]},
                            status_code=200 if ok else 503)

    async def index(request: Request) -> Response:
        """Triton's repository index: every model, or with ``{"ready": true}`` only those ready now (as gRPC's)."""
        rows = extensions.mark_index(service.holder.index(), service.unloaded)
        if extensions.index_ready_only(await extensions.read_body(request)):
            rows = [r for r in rows if r["state"] == "READY"]
        return JSONResponse(rows)

    async def reload(request: Request) -> Response:
        status, body = await service.reload(trigger="http")
        return JSONResponse(body, status_code=status)

    async def metrics(request: Request) -> Response:
        return Response(service.metrics.render(), media_type=service.metrics.content_type)

    async def telemetry(request: Request) -> Response:
        return JSONResponse(served_or(503).release.telemetry())

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        detail = exc.detail
        if detail in ("Not Found", "Method Not Allowed"):
            detail = f"{detail}: {clip(request.method, 16)} {clip(request.url.path)} (docs/serving.md lists the routes)"
        return JSONResponse({"error": detail}, status_code=exc.status_code, headers=exc.headers)

    async def internal_error(request: Request, exc: Exception) -> Response:
        return service.internal_error(request.scope.get("tileship.request_id", "?"), exc)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        grpc_server = None
        if config.grpc_port is not None:  # KServe v2 gRPC on the same loop and Service (serve.grpc_service);
            # first: a port that cannot be bound stops the start before anything else runs
            from tileship.serve import grpc_service

            grpc_server, service.grpc_port = await grpc_service.start(service, config.grpc_host, config.grpc_port)
        task = asyncio.create_task(service.initial_load())
        loop = asyncio.get_running_loop()
        hup = config.handle_sighup and threading.current_thread() is threading.main_thread()
        if hup:
            def on_hup() -> None:
                t = loop.create_task(service.reload(trigger="SIGHUP"))
                service.background.add(t)
                t.add_done_callback(service.background.discard)

            loop.add_signal_handler(signal.SIGHUP, on_hup)
        service.log.event("start", source=str(config.source), max_inflight=config.max_inflight,
                          max_body_bytes=config.max_body_bytes,
                          strict_shapes=config.strict_shapes, worker_threads=config.worker_threads,
                          grpc_port=service.grpc_port)
        if grpc_server is not None and (capped := config.grpc_capped()) is not None:
            # a warning, not a refusal: REST honours the larger limits (ServeConfig.grpc_capped)
            service.log.event("grpc_limits", "warning", message=capped,
                              grpc_max_message_bytes=config.grpc_max_message_bytes,
                              max_body_bytes=config.max_body_bytes, max_output_bytes=config.limits.max_output_bytes)
        try:
            yield
        finally:
            if grpc_server is not None:
                await grpc_server.stop(grpc_service.GRACE_S)
            if hup:
                loop.remove_signal_handler(signal.SIGHUP)
            if not task.done():
                task.cancel()
            service.pool.shutdown(wait=False, cancel_futures=True)
            service.pulls.close()
            if service.workers is not None:
                await asyncio.to_thread(service.workers.close)
            service.diagnostics.close()
            service.shm.close()
            service.log.event("stop")

    routes = [
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/models/stats", extensions.stats, methods=["GET"]),  # before /v2/models/{name}
        Route("/v2/models/{name}", model_metadata, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}", model_metadata, methods=["GET"]),
        Route("/v2/models/{name}/ready", model_ready, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}/ready", model_ready, methods=["GET"]),
        Route("/v2/models/{name}/infer", service.infer, methods=["POST"]),
        Route("/v2/models/{name}/stats", extensions.stats, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}/stats", extensions.stats, methods=["GET"]),
        Route("/v2/models/{name}/config", extensions.config, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}/config", extensions.config, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}/infer", service.infer, methods=["POST"]),
        Route("/v2/repository/index", index, methods=["POST", "GET"]),
        Route("/v2/repository/reload", reload, methods=["POST"]),
        Route("/v2/repository/models/{name}/load", extensions.load, methods=["POST"]),
        Route("/v2/repository/models/{name}/unload", extensions.unload, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v2/tileship/canary", canary_http.endpoint, methods=["GET", "POST", "DELETE"]),
        *shm_http.ROUTES,
        Route("/v2/tileship/telemetry", telemetry, methods=["GET"]),
        Route("/v2/logging", log_settings.endpoint, methods=["GET", "POST"]),
        Route("/v2/trace/setting", trace.endpoint, methods=["GET", "POST"]),
        Route("/v2/models/{name}/trace/setting", trace.endpoint, methods=["GET", "POST"]),
        Route(openapi.PATH, openapi.endpoint, methods=["GET"]),
    ]
    handlers = {HTTPException: http_error, Exception: internal_error}
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.service = service
    wrapped = RequestIds(app, service)
    wrapped.state = app.state  # type: ignore[attr-defined]
    return wrapped
