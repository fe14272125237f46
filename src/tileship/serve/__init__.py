"""``tileship serve``: the operators of a release over the Open Inference Protocol (KServe v2 REST and gRPC).

    protocol   parse requests (JSON and the binary tensor data extension); call_plan checks them against a declaration
    holder     the live release; load + check + warm off to the side, then swap (hot swap)
    hot_swap   a reload: resolve, load and warm (holder), roll the workers, swap, record it; 409 naming the stage
    app        the ASGI app: routes, admission control, worker thread, errors, metrics, logs
    calls      one inference request through the server, whatever carried it (REST or gRPC)
    grpc_service  the KServe v2 gRPC endpoint (--grpc-port) on the same loop and Service;
               grpc_codec its message <-> request/response conversions, grpc_handlers each RPC's wrapper
    model      a whole model (``--llama``) swapped onto each release the holder prepares
    server     uvicorn in the foreground (``run``) or on a background thread (``BackgroundServer``)
    jsonlog    one JSON object per log line
    ray_fleet  ``serve --ray``: these apps as Ray Serve replicas (ray_replica); fleet_plan rolls a registry change
               through them (canary replica, judged, then the rest, or a rollback); Ray imported lazily

docs/serving.md describes the routes, the error table and the policies.
"""

from __future__ import annotations

from tileship.serve.config import ServeConfig
from tileship.serve.routes import create_app
from tileship.serve.server import EXIT_FATAL, BackgroundServer, run

__all__ = ["EXIT_FATAL", "BackgroundServer", "ServeConfig", "create_app", "run"]
