"""The build farm on Ray: every specialization is a Ray task (``tileship build --ray``).

A task asks for one CPU and runs exactly what a local build runs, ``compile_one``: the worker
subprocess (``tileship.build.worker``) under the same timeout, in the same fixed work path, in a
temp dir on its node. It imports the operators from the sources the release ships
(``sources/``, sent once through the object store), never from the driver's disk. The artifact
files come back as bytes through the object store and the driver writes them where the local
build would have, so the release id is the same, byte for byte, as a local build's.

Failures are values, as locally: a compile that fails is a ``SpecResult`` with its commands and
log and is not retried (``retry_exceptions=False``); a task whose worker process or node dies is
retried by Ray at most twice (``max_retries=2``), then recorded as failed with the reason.

Ray is optional (the ``tileship[ray]`` extra): this module imports it only when a farm runs.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tileship.errors import BuildError

MAX_RETRIES = 2


@dataclass(frozen=True)
class RayFarm:
    """Where and how to run the build on Ray. ``address`` None starts (or, with ``RAY_ADDRESS``
    set, attaches to) a local cluster; ``progress`` draws a bar on a TTY, plain lines otherwise."""

    address: str | None = None
    progress: bool = False


@dataclass(frozen=True)
class _OpName:
    """What ``compile_one`` reads of an operator: the worker imports it by module and name."""

    module: str
    name: str


def require_ray() -> Any:
    """The ``ray`` module. Raises BuildError naming the extra when it is not installed."""
    try:
        import ray
    except ImportError as exc:
        raise BuildError("--ray needs Ray, which is not installed",
                         hint="pip install 'tileship[ray]' (on the driver and on every node)") from exc
    return ray


def _check_reachable(address: str | None, timeout_s: float = 5.0) -> None:
    """Raise BuildError when ``HOST:PORT`` (or ``ray://HOST:PORT``) refuses a TCP connection:
    ``ray.init`` would otherwise retry for minutes. ``None`` and ``auto`` are not checked."""
    if not address or address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # let Ray parse what it accepts
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise BuildError(f"cannot reach the Ray cluster at {address}: {exc}",
                         hint="start one with `ray start --head --port=6379` and pass --ray-address HEAD:6379") from exc


def _node_fingerprint() -> dict[str, str]:
    """What must match between the driver and a node for the artifacts to be the same."""
    return {"tilelang": importlib.metadata.version("tilelang"), "python": "{}.{}".format(*sys.version_info[:2]),
            "platform": f"{sys.platform}-{platform.machine()}"}


def _materialize(sources: dict[str, bytes], digest: str, root: Path) -> Path:
    """The shipped sources written once per node under ``root/sources-<digest>`` (atomic)."""
    dest = root / f"sources-{digest}"
    if not dest.exists():
        tmp = Path(tempfile.mkdtemp(prefix=".sources-", dir=root))
        for rel, data in sources.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        try:
            os.replace(tmp, dest)
        except OSError:  # another task on this node won the race
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _compile_on_node(job: dict[str, Any], sources: dict[str, bytes]) -> dict[str, Any]:
    """The Ray task: compile one specialization on this node; return its result and files."""
    import ray

    from tileship.build.builder import compile_one
    from tileship.declare.spec import Specialization

    fault = job.get("fault_once")
    if fault and not os.path.exists(fault):  # test hook: this worker process dies once
        Path(fault).write_text(job["spec_id"])
        os._exit(1)
    ctx = ray.get_runtime_context()
    node = f"{ray.util.get_node_ip_address()}/{ctx.get_node_id()[:8]}"
    root = Path(tempfile.gettempdir()) / "tileship-ray"
    root.mkdir(parents=True, exist_ok=True)
    sys_path = str(_materialize(sources, job["sources_digest"], root)) if sources else None
    out = Path(tempfile.mkdtemp(prefix="spec-", dir=root))
    try:
        r = compile_one(_OpName(job["module"], job["op"]), Specialization.from_json(job["spec"]),  # type: ignore[arg-type]
                        out, timeout_s=job["timeout_s"], sys_path=sys_path)
        files = _read_tree(out) if r.ok else {}
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {"ok": r.ok, "seconds": r.seconds, "error": r.error, "log": r.log, "commands": [list(c) for c in r.commands],
            "timed_out": r.timed_out, "files": files, "node": node, "fingerprint": _node_fingerprint()}


def _read_tree(root: Path | None) -> dict[str, bytes]:
    """posix relative path -> bytes of every file under ``root`` (empty when it is missing)."""
    if root is None or not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_jobs_on_ray(jobs: Sequence[tuple[Any, Any, Path]], farm: RayFarm, *, timeout_s: float,
                    sources_dir: Path | None = None, on_progress: Callable[[Any], None] | None = None) -> list[Any]:
    """Compile each (operator, specialization, out dir) as a Ray task; write each artifact into
    its out dir; return one ``SpecResult`` per job, in completion order.

    Never raises for a failed or lost task (a value); raises BuildError when Ray is missing or
    the cluster cannot be reached. Shuts down only a cluster connection it opened itself.
    """
    from tileship import env
    from tileship.build.builder import SpecResult

    ray = require_ray()
    opened = not ray.is_initialized()
    if opened:
        _check_reachable(farm.address)
        try:
            ray.init(address=farm.address or None, include_dashboard=False, logging_level="warning")
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise BuildError(f"cannot reach the Ray cluster at {farm.address or 'local'}: {exc}",
                             hint="start one with `ray start --head` and pass --ray-address HOST:6379") from exc
    try:
        sources = _read_tree(sources_dir)
        digest = hashlib.sha256(b"".join(k.encode() + b"\0" + v for k, v in sources.items())).hexdigest()[:16]
        sources_ref = ray.put(sources)
        task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(_compile_on_node)
        fault = env.ray_fault_once()
        local = _node_fingerprint()
        todo = list(jobs)
        todo.reverse()
        running: dict[Any, tuple[Any, Path]] = {}
        results: list[Any] = []
        with _Display(len(todo), farm.progress) as display:
            while todo or running:
                window = max(1, int(ray.cluster_resources().get("CPU", 1)))
                while todo and len(running) < window:
                    op, spec, out = todo.pop()
                    job = {"spec_id": spec.id, "module": op.module, "op": op.name, "spec": spec.to_json(),
                           "timeout_s": timeout_s, "sources_digest": digest,
                           "fault_once": str(fault) if fault else None}
                    running[task.remote(job, sources_ref)] = (spec, out)
                display.update(running=len(running))
                done, _ = ray.wait(list(running), num_returns=1)
                spec, out = running.pop(done[0])
                try:
                    value = ray.get(done[0])
                except Exception as exc:  # the task was lost (worker or node died) after its retries
                    first = (str(exc).splitlines() or [""])[0][:2000]
                    r = SpecResult(spec, False, 0.0, log=str(exc)[-20000:],
                                   error=f"Ray task lost after {MAX_RETRIES} retries: {type(exc).__name__}: {first}")
                    node = "?"
                else:
                    r, node = _to_result(SpecResult, spec, value, out, local), value["node"]
                results.append(r)
                display.update(running=len(running), finished=r, node=node)
                if on_progress:
                    on_progress(r)
        return results
    finally:
        if opened:
            ray.shutdown()


def _to_result(cls: Any, spec: Any, value: dict[str, Any], out: Path, local: dict[str, str]) -> Any:
    """A ``SpecResult`` from a task's value, its files written into ``out``."""
    drift = {k: (v, value["fingerprint"].get(k)) for k, v in local.items() if value["fingerprint"].get(k) != v}
    if drift:  # a node that does not run the driver's toolchain would build a different release
        what = ", ".join(f"{k} {theirs} (driver: {ours})" for k, (ours, theirs) in sorted(drift.items()))
        return cls(spec, False, value["seconds"], error=f"node {value['node']} runs {what}", log=value["log"])
    if value["ok"]:
        for rel, data in value["files"].items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_bytes(data)
    return cls(spec, value["ok"], value["seconds"], error=value["error"], log=value["log"],
               commands=tuple(tuple(c) for c in value["commands"]), timed_out=value["timed_out"])


class _Display:
    """Done / running / failed and per-node throughput: a rich bar on a TTY, plain lines otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.t0 = total, enabled, time.perf_counter()
        self.done = self.failed = self.running = 0
        self.nodes: Counter[str] = Counter()
        self.tty = enabled and sys.stdout.isatty()
        self.progress: Any = None

    def __enter__(self) -> _Display:
        if self.tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("[bold]building on Ray[/]"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TextColumn("{task.description}"))
            self.progress.start()
            self.task = self.progress.add_task("", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def _nodes(self) -> str:
        minutes = max(time.perf_counter() - self.t0, 1e-6) / 60
        return "  ".join(f"{n} {c} ({c / minutes:.1f}/min)" for n, c in sorted(self.nodes.items()))

    def update(self, *, running: int, finished: Any = None, node: str = "") -> None:
        self.running = running
        if finished is not None:
            self.done += 1
            self.failed += not finished.ok
            self.nodes[node] += 1
        if not self.enabled:
            return
        status = f"done {self.done}/{self.total}  running {self.running}  failed {self.failed}"
        if self.progress is not None:
            self.progress.update(self.task, completed=self.done, description=f"{status}  | {self._nodes()}")
        elif finished is not None:
            state = "ok" if finished.ok else f"FAILED ({finished.error})"
            print(f"[ray] {status}: {finished.spec.id} {state} on {node} in {finished.seconds:.1f} s", flush=True)
            if self.done == self.total:
                print(f"[ray] per node: {self._nodes()}", flush=True)
