"""Ahead-of-time build: every (operator x shape x target) compiled into a release bundle.

No GPU needed. Each specialization compiles in its own process (``tileship.build.worker``)
under a timeout, in parallel (the longest first, by the last builds' timings: ``build.schedule``),
so one crash or hang never takes the build down; failures are
values (``SpecResult``) recorded with the compiler commands and the full log in
``build-log.json``, never mixed with anything measured at serve time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from tileship.build import import_check, outputs, pins, schedule, sources
from tileship.build.lock import capture_environment, dump_lock, kernel_revision, make_lock
from tileship.declare.project import Project, revision_root, source_digest
from tileship.declare.spec import Operator, Specialization, describe, expand
from tileship.errors import COMPILER_FAILED, BuildError, first_diagnostic
from tileship.release import bundle
from tileship.runtime import native

_log = logging.getLogger("tileship.build")
#: the most of a compile's output a build log keeps per specialization
LOG_LIMIT = 256 * 1024


@dataclass(frozen=True)
class SpecResult:
    """One specialization's build: whether it compiled, how long it took, and why not when it did not."""
    spec: Specialization
    ok: bool
    seconds: float
    error: str | None = None
    log: str = ""
    commands: tuple[tuple[str, ...], ...] = ()
    timed_out: bool = False


@dataclass(frozen=True)
class BuildResult:
    release_id: str
    path: Path
    results: tuple[SpecResult, ...]
    seconds: float
    key_id: str | None = None
    #: what this build finished or removed of killed builds in its output directory (``outputs.recover``)
    recovered: tuple[str, ...] = ()

    @property
    def built(self) -> list[str]:
        return [r.spec.id for r in self.results if r.ok]

    @property
    def failed(self) -> list[SpecResult]:
        return [r for r in self.results if not r.ok]

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass
class BuildOptions:
    jobs: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))
    timeout_s: float = 300.0
    image_digest: str | None = None
    sign_key: Path | None = None
    on_progress: Callable[[SpecResult], None] | None = None
    #: a ``toolchain.Toolchain``: compile workers run in its venv, with its wheels' nvcc
    toolchain: Any = None
    #: a ``ray_farm.RayFarm``: compile on a Ray cluster instead of local processes (same artifacts)
    ray: Any = None


def compile_one(op: Operator, spec: Specialization, out: Path, *, timeout_s: float,
                sys_path: str | None = None, toolchain: Any = None) -> SpecResult:
    """Compile ``spec`` in a child process into ``out``. Never raises for a compile failure."""
    out.mkdir(parents=True, exist_ok=True)
    # A fixed work path per specialization: the same inputs produce byte-identical
    # artifacts (paths leak into objects); a file lock serializes concurrent builds.
    work = Path(tempfile.gettempdir()) / "tileship-build" / hashlib.sha256(spec.id.encode()).hexdigest()[:16]
    work.parent.mkdir(parents=True, exist_ok=True)
    job = {"spec_id": spec.id, "module": op.module, "op": op.name, "spec": spec.to_json(),
           "out": str(out), "cache_dir": str(work / "cache"), "sys_path": sys_path, "parent": os.getpid()}
    t0 = time.perf_counter()
    with FileLock(str(work) + ".lock"):
        job_file = work.with_suffix(".job.json")
        job_file.write_text(json.dumps(job))
        python, env = (str(toolchain.python), toolchain.worker_env()) if toolchain else (sys.executable, _child_env())
        proc = subprocess.Popen([python, "-m", "tileship.build.worker", str(job_file)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            shutil.rmtree(out, ignore_errors=True)
            return SpecResult(spec, False, time.perf_counter() - t0, error=f"timed out after {timeout_s:g} s (killed)",
                              log=_tail(output), timed_out=True)
        finally:
            job_file.unlink(missing_ok=True)
    seconds = time.perf_counter() - t0
    result: dict[str, Any] = {}
    lines = output.rstrip().splitlines()
    if lines:
        try:
            result = json.loads(lines[-1])
            output = "\n".join(lines[:-1])
        except json.JSONDecodeError:
            result = {}
    commands = tuple(tuple(c) for c in result.get("commands", ()))
    if proc.returncode == 0 and result.get("ok"):
        return SpecResult(spec, True, seconds, log=_tail(output), commands=commands)
    shutil.rmtree(out, ignore_errors=True)
    if not result:
        error = f"compiler process died with exit status {proc.returncode}" + (
            f" (signal {-proc.returncode})" if proc.returncode < 0 else "")
    else:
        error = result.get("error", "unknown error")
    error = with_diagnostic(error, output)
    log = _tail(output + ("\n" + result["traceback"] if result.get("traceback") else ""))
    return SpecResult(spec, False, seconds, error=error, log=log, commands=commands)


def with_diagnostic(error: str, output: str) -> str:
    """``error`` (a worker's summary) with the compiler's first diagnostic in ``output`` appended when it ends with
    ``COMPILER_FAILED`` (g++ wrote it to the worker's output, not into TileLang's exception). The diagnostic is
    looked for after TileLang's ``Compilation error:``, whose own line holds an ``error:`` with nothing after it
    (a failed cache save logs it: the summary ended ``the compiler failed: error:``)."""
    if error.endswith(COMPILER_FAILED) and (hit := first_diagnostic(output.split("Compilation error:", 1)[-1])):
        return f"{error}: {hit}"
    return error


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else src
    return env


def _tail(text: str) -> str:
    return text if len(text) <= LOG_LIMIT else "[... truncated ...]\n" + text[-LOG_LIMIT:]


def build(project: Project, ops: Mapping[str, Operator], out_root: Path,
          options: BuildOptions | None = None) -> BuildResult:
    """Lock the environment and compile every specialization into ``out_root/<release id>``.

    Atomic: the release directory appears complete or not at all. Raises BuildError only
    when nothing could be built at all (no specializations, unwritable output).
    """
    opts = options or BuildOptions()
    if opts.ray is not None and opts.toolchain:  # the toolchain venv is a path on this machine only
        raise BuildError("--toolchain and --ray cannot be combined yet", hint="drop one of them")
    t0 = time.perf_counter()
    specs = [(ops[s.op], s) for op in ops.values() for s in expand(op, project.targets)]
    if not specs:
        raise BuildError(f"no specialization to build for targets {list(project.targets)}",
                         hint="check the project's targets against each operator's targets")
    out_root.mkdir(parents=True, exist_ok=True)
    recovered = tuple(outputs.recover(out_root))  # what killed builds left: a release moved aside is put back
    specs = schedule.longest_first(specs, out_root)  # the start order only: the release is the same
    staging = outputs.staging_dir(out_root)
    try:
        tool = opts.toolchain.require() if opts.toolchain else None  # raises ToolchainError when unusable
        env = opts.toolchain.capture_environment() if opts.toolchain else capture_environment()
        shipped, imports = sources.ship(ops, project.root, staging)
        descs = {name: {**describe(op), "sources": shipped[name], "reference_imports": imports[name],
                        pins.KEY: pins.pin(op, shipped[name])} for name, op in ops.items()}
        lock = make_lock(env=env, revision=kernel_revision(revision_root(project, ops)), sources=source_digest(ops),
                         operators=descs, targets=list(project.targets),
                         model={"name": project.model, "version": project.model_version},
                         image_digest=opts.image_digest, toolchain=tool)
        (staging / "tileship.lock").write_text(dump_lock(lock))
        python, env = (str(opts.toolchain.python), opts.toolchain.worker_env()) if opts.toolchain else \
            (sys.executable, _child_env())
        importing = import_check.start(descs, staging / sources.SOURCES, python=python, env=env)
        results: list[SpecResult] = []
        sys_path = str(project.root) if project.root else None
        if opts.ray is not None:
            from tileship.build import ray_farm

            results = ray_farm.run_jobs_on_ray([(op, s, staging / "specs" / s.id) for op, s in specs], opts.ray,
                                               timeout_s=opts.timeout_s, sources_dir=staging / sources.SOURCES,
                                               on_progress=opts.on_progress)
        else:
            with ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
                futs = {pool.submit(compile_one, op, s, staging / "specs" / s.id, timeout_s=opts.timeout_s,
                                    sys_path=sys_path, toolchain=opts.toolchain): s for op, s in specs}
                for fut in as_completed(futs):
                    r = fut.result()
                    results.append(r)
                    if opts.on_progress:
                        opts.on_progress(r)
        results.sort(key=lambda r: r.spec.id)
        import_check.finish(importing, timeout_s=opts.timeout_s)  # the snapshot imports as a serving host will
        native_build = _native_table(project, staging)
        release = {
            "schema": 1,
            "model": {"name": project.model, "version": project.model_version},
            "kernel_revision": lock["kernel_revision"],
            "policy": project.policy(),
            "targets": sorted(project.targets),
            "operators": descs,
            "specializations": {r.spec.id: {"spec": r.spec.to_json(), "status": "built" if r.ok else "failed",
                                            **({"error": r.error} if not r.ok else {})} for r in results},
            **({"native": {"fastcall": native_build.to_json()}} if native_build is not None else {}),
        }
        bundle.write_json_atomic(staging / "release.json", release)
        bundle.write_json_atomic(staging / "build-log.json", {
            "seconds": round(time.perf_counter() - t0, 3), "jobs": opts.jobs, "timeout_s": opts.timeout_s,
            **({"ray": opts.ray.address or "local"} if opts.ray is not None else {}),
            **({"native_seconds": round(native_build.seconds, 3)} if native_build is not None else {}),
            "specializations": {r.spec.id: {"ok": r.ok, "seconds": round(r.seconds, 3), "timed_out": r.timed_out,
                                            "error": r.error, "commands": [" ".join(c) for c in r.commands],
                                            "log": r.log} for r in results}})
        manifest, final, key_id = outputs.commit(staging, out_root, opts.sign_key)  # signed, then one rename
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return BuildResult(manifest["release_id"], final, tuple(results), time.perf_counter() - t0, key_id, recovered)


def _native_table(project: Project, staging: Path) -> native.NativeBuild | None:
    """Compile the dispatcher's table (``runtime.native``) into the release: it launches the CUDA (tvm-ffi)
    and "c"-target kernels; None when the project has neither target. A failure is recorded, not raised:
    the release then serves through the Python dispatcher."""
    if not any(t.startswith("cuda") or t == "c" for t in project.targets):
        return None
    built = native.compile_library(staging / native.LIBRARY)
    if not built.ok:
        _log.warning("the dispatch table did not compile (%s); the release serves without it", built.error[-300:])
    return built
