"""Running the app on uvicorn: in the foreground (``tileship serve``) or on a background
thread bound to a loopback port (tests, benchmarks).

Exit status of ``run``: 0 after SIGINT/SIGTERM (in-flight requests finish first, up to
``graceful_s``); ``EXIT_FATAL`` after a sticky device error (e.g. a CUDA illegal address),
which poisons the process's CUDA context: the process stops answering and exits so that its
supervisor (systemd ``Restart=on-failure``, a Kubernetes restart policy) starts a fresh one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import socket
import threading
import time
from typing import Any

from tileship.serve.app import Service
from tileship.serve.config import ServeConfig
from tileship.serve.connections import uvicorn_limits
from tileship.serve.jsonlog import uvicorn_log_config
from tileship.serve.routes import create_app

EXIT_FATAL = 3


def _uvicorn(app: Any, host: str, port: int, log_level: str, graceful_s: float, config: ServeConfig) -> Any:
    import uvicorn

    # grpc.aio shares the loop (--grpc-port); tileship runs it on asyncio's own loop only, as tested, never uvloop
    loop = "asyncio" if config.grpc_port is not None else "auto"
    cfg = uvicorn.Config(app, host=host, port=port, lifespan="on", access_log=False, loop=loop,
                         log_config=uvicorn_log_config(log_level),
                         server_header=False, timeout_graceful_shutdown=int(graceful_s),
                         **uvicorn_limits(config, app.state.service.metrics.rejected))
    return uvicorn.Server(cfg)


def run(config: ServeConfig, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning",
        graceful_s: float = 30.0) -> int:
    """Serve in the foreground until SIGINT/SIGTERM or a fatal device error; return the exit status.

    With ``config.grpc_port`` set, the KServe v2 gRPC endpoint listens on ``host`` at that port too.

    SIGHUP reloads the source (like ``POST /v2/repository/reload``).
    """
    fatal: list[str] = []
    holder: dict[str, Any] = {}

    def on_fatal(reason: str) -> None:
        fatal.append(reason)
        holder["server"].should_exit = True

    app = create_app(dataclasses.replace(config, handle_sighup=True, grpc_host=host), on_fatal=on_fatal)
    server = holder["server"] = _uvicorn(app, host, port, log_level, graceful_s, config)
    # uvicorn re-raises SIGINT/SIGTERM once it has shut down gracefully, against the handlers
    # in place before it started: make those no-ops so a requested stop exits 0, not by the signal.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if fatal:
        return EXIT_FATAL
    return 0 if server.started else 1


class BackgroundServer:
    """The app on ``host:port`` (port 0: a free one) in a daemon thread. ``start()`` returns
    once uvicorn listens (the release may still be loading: poll readiness)."""

    def __init__(self, config: ServeConfig, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 graceful_s: float = 10.0) -> None:
        self.fatal: list[str] = []
        self.app = create_app(dataclasses.replace(config, grpc_host=host), on_fatal=self._on_fatal)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self.server = _uvicorn(self.app, host, self.port, log_level, graceful_s, config)
        self._thread = threading.Thread(target=self._run, name=f"tileship-serve-{self.port}", daemon=True)
        self.error: BaseException | None = None

    @property
    def service(self) -> Service:
        return self.app.state.service  # type: ignore[no-any-return]

    @property
    def grpc_url(self) -> str | None:
        """``host:port`` of the gRPC endpoint (tritonclient.grpc's url) once listening; None when off."""
        port = self.service.grpc_port
        return f"{self.host}:{port}" if port is not None else None

    def _on_fatal(self, reason: str) -> None:
        self.fatal.append(reason)
        self.server.should_exit = True

    def _run(self) -> None:
        try:
            asyncio.run(self.server.serve(sockets=[self.sock]))
        except BaseException as exc:  # surfaced by start()/stop()
            self.error = exc

    def start(self, timeout: float = 60.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if self.error is not None or not self._thread.is_alive():
                raise RuntimeError(f"the server thread stopped before listening: {self.error!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not listen on {self.url} within {timeout} s")
            time.sleep(0.01)
        return self

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Poll the holder until a release serves (True) or loading failed / timed out (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.service.holder
            if h.current is not None:
                return True
            if h.state in ("failed", "fatal"):
                return False
            time.sleep(0.02)
        return False

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
