"""The KServe v2 gRPC endpoint (``GRPCInferenceService``), served by the REST process on its event loop.

``tileship serve --grpc-port N`` starts it next to uvicorn (``start``, from the app's lifespan),
on the same ``Service``: inference goes through ``calls.run`` exactly as REST inference does
(validation, routing and canary, admission, deadline, metrics, statistics, log lines), and the
other RPCs call the functions the REST routes call (``serve.extensions``, the holder's
readiness and index). tritonclient.grpc (sync and ``aio``) works against it.

Every error is a gRPC status with a message naming what was wrong (``grpc_codec.code_for``):
INVALID_ARGUMENT for a request that does not fit the model (names, datatypes, shapes, byte
sizes), NOT_FOUND for an unknown model or version and an unloaded model (``ModelReady`` answers ``ready:
false`` instead, as Triton's does), UNAVAILABLE while not ready, overloaded or for an unloaded model's named
version (``extensions.ModelUnloaded``), RESOURCE_EXHAUSTED
past a request limit or the shared-memory region limit, DEADLINE_EXCEEDED past the request timeout,
FAILED_PRECONDITION for a load that failed, ALREADY_EXISTS for a shared-memory region registered twice
(``LogSettings`` is Triton's logging extension, ``serve.log_settings``; ``TraceSetting`` its trace extension,
``serve.trace``; streaming inference, ``ModelStreamInfer``, is ``serve.grpc_stream``).
A bug is INTERNAL naming the request id (the client's ``x-request-id`` metadata when printable,
else a fresh one; echoed as trailing metadata) and is logged with its traceback, as REST's 500s are.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any

import grpc
from starlette.exceptions import HTTPException
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tileship import __version__
from tileship.serve import calls, extensions, grpc_codec, grpc_gate, grpc_stream, log_settings, trace
from tileship.serve.grpc_handlers import register, rpc
from tileship.serve.validate import BadRequest, short

if TYPE_CHECKING:
    from tileship.serve.app import Service

#: how long stopping waits for RPCs in flight
GRACE_S = 5.0


def receive_limit(ours: int) -> int:
    """grpc's own receive limit for a request limit of ``ours`` bytes: twice it (a message up to there reaches our
    deserializer, which refuses and counts it), at most protobuf's ``grpc_codec.MAX_MESSAGE``."""
    return min(2 * ours, grpc_codec.MAX_MESSAGE)


class Servicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The RPCs of ``GRPCInferenceService`` over one ``Service``. Runs on the Service's event loop."""

    def __init__(self, service: Service) -> None:
        self.service = service
        #: at most ``max_connections`` RPCs at once, and the count of those grpc ends before their answer
        self.gate = grpc_gate.Gate(service.config.max_connections, service.metrics.rejected,
                                   service.config.body_timeout_s)
        self.max_message = service.config.grpc_max_message_bytes
        #: the answer's encoder: refuses a response past one message (``grpc_codec.encode``)
        self.encode = functools.partial(grpc_codec.encode, max_bytes=self.max_message)
        self._finishing: set[asyncio.Task[Any]] = set()  # work ``_finish`` runs on past its RPC

    async def _finish(self, work: Awaitable[Any]) -> Any:
        """``await work``, which runs to its end even if this RPC is cancelled (its outcome is then dropped)."""
        task = asyncio.ensure_future(work)
        self._finishing.add(task)
        task.add_done_callback(self._finished)
        return await asyncio.shield(task)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._finishing.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: an RPC that gave up never reads it, and asyncio would log it

    # -- health and metadata ------------------------------------------------------------------
    @rpc
    async def ServerLive(self, request: Any, context: Any, rid: str) -> Any:
        return pb.ServerLiveResponse(live=True)

    @rpc
    async def ServerReady(self, request: Any, context: Any, rid: str) -> Any:
        return pb.ServerReadyResponse(ready=self.service.readiness()[0])

    @rpc
    async def ModelReady(self, request: Any, context: Any, rid: str) -> Any:
        """False while no release serves (nothing is ready), for an unloaded model, and for a model or
        version the serving release does not have: never an error, as Triton's ``ModelReady`` (its core
        answers ``ready=false`` for a model it does not know; REST's ``/ready`` answers that with a 404)."""
        svc = self.service
        cur = svc.holder.current
        if cur is None or (request.name not in cur.release.ops and request.name not in cur.models):
            return pb.ModelReadyResponse(ready=False)
        if request.version and request.version != cur.release_id:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=svc.readiness()[0] and request.name not in svc.unloaded)

    @rpc
    async def ServerMetadata(self, request: Any, context: Any, rid: str) -> Any:
        return pb.ServerMetadataResponse(name="tileship", version=__version__,
                                         extensions=extensions.claimed(self.service))

    @rpc
    async def ModelMetadata(self, request: Any, context: Any, rid: str) -> Any:
        cur = self._model(request.name, request.version)
        extensions.check_loaded(self.service, request.name, request.version or None, "grpc")
        doc = extensions.model_metadata(self.service, cur, request.name)
        return grpc_codec.message(doc, pb.ModelMetadataResponse())

    def _model(self, name: str, version: str) -> Any:
        """The serving release when it serves ``name`` (at ``version``, when given); raises as REST's routes."""
        cur = extensions.served(self.service)
        extensions.known(cur, name)
        if version and version != cur.release_id:
            raise HTTPException(404, f"unknown version {short(version)} of model {name}: serving version "
                                     f"{cur.release_id}")
        return cur

    # -- inference ------------------------------------------------------------------------------
    @rpc
    async def ModelInfer(self, request: Any, context: Any, rid: str) -> Any:
        svc = self.service

        async def read() -> tuple[Any, int]:
            return grpc_codec.parse(request, svc.config.limits), request.ByteSize()

        call = calls.Call(request.model_name, request.model_version or None, rid, read, self.encode,
                          grpc_codec.output_bytes, "grpc", max_message_bytes=self.max_message)
        answer = await calls.run(svc, call)
        if answer.status != 200:
            await context.abort(grpc_codec.code_for(answer.status, answer.error), answer.message,
                                (("x-request-id", rid),))
        return answer.encoded

    async def ModelStreamInfer(self, requests: Any, context: Any) -> AsyncIterator[Any]:
        """Triton's streaming inference: one response per request, in order (``serve.grpc_stream``)."""
        async for response in grpc_stream.stream_infer(self, requests, context):
            yield response

    # -- Triton's extensions ------------------------------------------------------------------
    @rpc
    async def ModelConfig(self, request: Any, context: Any, rid: str) -> Any:
        doc = extensions.config_of(self.service, request.name, request.version or None, "grpc")
        return pb.ModelConfigResponse(config=grpc_codec.message(doc, model_config_pb2.ModelConfig()))

    @rpc
    async def ModelStatistics(self, request: Any, context: Any, rid: str) -> Any:
        rows = extensions.stat_rows(self.service, request.name or None, request.version or None, "grpc")
        return grpc_codec.message({"model_stats": rows}, pb.ModelStatisticsResponse())

    @rpc
    async def RepositoryIndex(self, request: Any, context: Any, rid: str) -> Any:
        rows = extensions.mark_index(self.service.holder.index(), self.service.unloaded)
        if request.ready:
            rows = [r for r in rows if r["state"] == "READY"]
        return grpc_codec.message({"models": rows}, pb.RepositoryIndexResponse())

    @rpc
    async def RepositoryModelLoad(self, request: Any, context: Any, rid: str) -> Any:
        extensions.check_load_parameters(request.parameters)
        # to its end even when the client gives up (a deadline, a cancel), as for a REST client that hangs up:
        # a load cancelled halfway would drop the release it prepared and leave the model unloaded
        status, body = await self._finish(extensions.load_model(self.service, request.model_name, "grpc"))
        if status != 200:
            hint = f" ({body['hint']})" if body.get("hint") else ""
            raise BadRequest(status, f"load of {short(request.model_name)} failed at {body.get('stage')}: "
                                     f"{body.get('error')}{hint}")
        return pb.RepositoryModelLoadResponse()

    @rpc
    async def RepositoryModelUnload(self, request: Any, context: Any, rid: str) -> Any:
        if "unload_dependents" in request.parameters:  # as the REST route: a bool or nothing, checked before unloading
            which = request.parameters["unload_dependents"].WhichOneof("parameter_choice")
            if which != "bool_param":
                raise BadRequest(400, f"unload_dependents must be a bool_param (true or false), not {which or 'empty'}")
        extensions.unload_model(self.service, request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # -- Triton's system shared memory (serve.shm; the same registry as the REST routes) ----------
    @rpc
    async def SystemSharedMemoryStatus(self, request: Any, context: Any, rid: str) -> Any:
        rows = self.service.shm.status(request.name or None)
        return pb.SystemSharedMemoryStatusResponse(
            regions={r["name"]: pb.SystemSharedMemoryStatusResponse.RegionStatus(**r) for r in rows})

    @rpc
    async def SystemSharedMemoryRegister(self, request: Any, context: Any, rid: str) -> Any:
        self.service.shm.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @rpc
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any, rid: str) -> Any:
        self.service.shm.unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    # -- Triton's CUDA shared memory (serve.cuda_shm; the same registry) --------------------------
    @rpc
    async def CudaSharedMemoryStatus(self, request: Any, context: Any, rid: str) -> Any:
        rows = self.service.shm.status(request.name or None, "cuda")
        return pb.CudaSharedMemoryStatusResponse(
            regions={r["name"]: pb.CudaSharedMemoryStatusResponse.RegionStatus(**r) for r in rows})

    @rpc
    async def CudaSharedMemoryRegister(self, request: Any, context: Any, rid: str) -> Any:
        await asyncio.to_thread(self.service.shm.register_cuda, request.name, request.raw_handle, request.device_id,
                                request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    @rpc
    async def CudaSharedMemoryUnregister(self, request: Any, context: Any, rid: str) -> Any:
        await asyncio.to_thread(self.service.shm.unregister, request.name or None, "cuda")
        return pb.CudaSharedMemoryUnregisterResponse()

    @rpc
    async def TraceSetting(self, request: Any, context: Any, rid: str) -> Any:
        """Triton's trace extension (``serve.trace``): a request without settings reads them."""
        name = request.model_name or None
        if name is not None:
            extensions.known(extensions.served(self.service), name)
        changes = trace.grpc_changes(request.settings)
        now = self.service.traces.update(name, changes) if changes else self.service.traces.settings(name)
        value = pb.TraceSettingResponse.SettingValue
        return pb.TraceSettingResponse(settings={k: value(value=v if isinstance(v, list) else [v])
                                                 for k, v in now.items()})

    @rpc
    async def LogSettings(self, request: Any, context: Any, rid: str) -> Any:
        """Triton's logging extension (``serve.log_settings``): an empty request reads the settings."""
        doc = {k: getattr(v, v.WhichOneof("parameter_choice")) if v.WhichOneof("parameter_choice") else None
               for k, v in request.settings.items()}
        now = log_settings.apply(self.service, doc) if doc else self.service.log.settings.to_json()
        value = pb.LogSettingsResponse.SettingValue
        return pb.LogSettingsResponse(settings={
            k: value(bool_param=v) if isinstance(v, bool) else value(uint32_param=v) if isinstance(v, int)
            else value(string_param=v) for k, v in now.items()})


async def start(service: Service, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """Listen on ``host:port`` (0: a free port) on the running loop; (server, bound port).

    Messages are bounded as REST bodies are: ``ServeConfig.grpc_max_request_bytes`` in (``max_body_bytes``,
    capped at gRPC's message limit; the handlers' deserializer refuses and counts a larger one); out, the output
    limit plus what a response echoes of its request (its ``id``, as long as a request may be) plus its header,
    so an answer the call produced is never dropped at send. At most
    ``max_connections`` RPCs run at once, counted from before their request arrives (RESOURCE_EXHAUSTED past it,
    counted: ``grpc_gate``); grpcio's own ``maximum_concurrent_rpcs`` is not set, since it refuses where no handler
    runs (uncounted, and without naming the limit).

    grpc's own receive limit is twice ours (``receive_limit``) so that our deserializer, which counts and names the
    limit, sees a message just past ours first: grpc refuses a larger one from its length prefix, before reading it
    (so it bounds what one RPC makes the server buffer), with its own message (``Received message larger than max
    (N vs. M)``); ``grpc_gate`` counts that refusal as ``request_not_received``. (When a body or output limit
    passes gRPC's message limit, the app logs it at start: ``grpc_limits``, a warning, since REST still honours it.)
    A connection must finish its handshake within ``header_timeout_s``.
    Raises RuntimeError when the address cannot be bound."""
    c = service.config
    most = c.grpc_max_message_bytes  # protobuf's 2 GiB: an answer past it is refused before it runs (``calls.run``)
    ours = c.grpc_max_request_bytes
    out = min(c.limits.max_output_bytes + c.max_body_bytes + (1 << 20), most)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", receive_limit(ours)),
                                      ("grpc.max_send_message_length", out),
                                      ("grpc.so_reuseport", 0),
                                      # a connection that never completes the HTTP/2 handshake is closed, as
                                      # REST closes one whose headers never finish (--header-timeout)
                                      ("grpc.server_handshake_timeout_ms", int(c.header_timeout_s * 1000))])
    register(Servicer(service), server, ours, grpc_cap=ours < c.max_body_bytes)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise RuntimeError(f"gRPC: cannot listen on {address}: {exc}") from None
    if not bound:
        raise RuntimeError(f"gRPC: cannot listen on {address}")
    await server.start()
    return server, bound
