"""Diagnostics bundles: everything needed to understand one failure, in one directory + .tar.gz.

``capture(release, ...)`` writes ``<out_dir>/<id>/`` and ``<out_dir>/<id>.tar.gz`` and returns
``DiagnosticsRef(id, path, archive)``; the id is what a server's error response carries. The folder
appears whole (written aside, then renamed); what a killed writer left is cleaned by the next capture.
Contents (each file present when its source is; ``summary.json`` says what was not)::

    summary.json             id, time, reason, release id, specializations, exception, call, notes
    traceback.txt            the exception's traceback
    call.json                shapes / dtypes / devices / strides of the failing call
    call_data.pt             its tensors (only with include_data=True: they may hold user data)
    runtime.json             a loaded release's status, decisions, counters, load errors, faults
    environment/lock.yaml    the release's lock
    environment/current.yaml the environment running now (tileship.build.lock.capture_environment)
    environment/side_by_side.txt  every locked field next to its running value, drift marked
    nvidia-smi.txt           ``nvidia-smi -q`` (or why it is absent)
    specs/<spec id>/         device_kernel.cu, host_kernel.cu, artifact.json, build.json
                             (compiler commands + log), sass.txt / ptx.txt from kernel.cubin
                             (cuobjdump / nvdisasm; absent tools are recorded in summary.json)

``capture`` never raises for a section it cannot write (it runs on failure paths, where
masking the original error would be worse); it never touches the CUDA context, so it works
after a sticky CUDA error. Hooks: ``watch(release)`` subscribes to the runtime's circuit
breaker; ``check_release(release)`` after a load (artifact load failures, drift).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tileship import env
from tileship.release import diagnostics_queue
from tileship.release.diagnostics_sections import (
    TOOL_TIMEOUT_S,  # noqa: F401 (re-exported)
    _clone,
    _environment,
    _json_file,
    _manifest_id,
    _release_root,
    _run,
    _runtime_view,
    _safe,
    _save_data,
    _spec,
    _tar,
    _troubled_specs,
    _write_json,
    describe_call,
)

_log = logging.getLogger("tileship.release.diagnostics")


@dataclass(frozen=True)
class DiagnosticsRef:
    """One written bundle: ``id`` (``diag-<UTC time>-<hex>``), its directory and its archive."""

    id: str
    path: Path
    archive: Path


def default_dir() -> Path:
    """``$TILESHIP_HOME/diagnostics``."""
    return env.home() / "diagnostics"


def new_id() -> str:
    return time.strftime("diag-%Y%m%dT%H%M%SZ-", time.gmtime()) + secrets.token_hex(3)


def capture(release: Any = None, *, spec_id: str | None = None, exc: BaseException | None = None,
            call: Sequence[Any] | None = None,
            out_dir: Path | str | None = None, reason: str | None = None, detail: str | None = None,
            include_data: bool = False,
            diag_id: str | None = None, _call_data: Sequence[Any] | None = None) -> DiagnosticsRef:
    """Write a diagnostics bundle and return its reference.

    ``release``: a loaded ``runtime.Release``, a release directory, or None. ``spec_id``: the
    specialization concerned; when None, the ones in trouble (build failed, load failed,
    circuit open), else all of them. ``exc``: the exception (default: the one being handled,
    if any). ``call``: the failing call's tensors (metadata only unless ``include_data``).
    Raises OSError only when ``out_dir`` or the bundle cannot be created (FileExistsError: ``diag_id`` is taken).

    The bundle is written in a staging folder (``.<id>.tmp<pid>``) renamed to ``<id>`` once its
    ``summary.json`` is written, then archived (``<id>.tar.gz``, through ``<id>.tar.gz.tmp<pid>-<random>``):
    killed at any instant, ``out_dir`` holds no ``<id>`` folder without its summary. What a killed writer left is
    settled by the next capture into the same folder (``diagnostics_queue.settle``).
    """
    if exc is None:
        exc = sys.exc_info()[1]
    did = diag_id or new_id()
    base = Path(out_dir) if out_dir is not None else default_dir()
    base.mkdir(parents=True, exist_ok=True)
    if (base / did).exists():
        raise FileExistsError(errno.EEXIST, "a diagnostics bundle with this id exists", str(base / did))
    diagnostics_queue.settle(base)  # what killed writers left
    root = diagnostics_queue.staging(base, did)
    root.mkdir()
    try:
        _write_sections(root, did, release, spec_id, exc, call, reason, detail, include_data, _call_data)
        os.rename(root, base / did)  # the bundle appears whole, summary.json included
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    archive = base / f"{did}.tar.gz"
    try:
        _tar(base / did, archive)
    except Exception as e:  # the folder is the bundle; a later capture or prune retries the archive
        _log.warning("diagnostics %s: could not write its archive: %s: %s", did, type(e).__name__, e)
    return DiagnosticsRef(did, base / did, archive)


def _write_sections(root: Path, did: str, release: Any, spec_id: str | None, exc: BaseException | None,
                    call: Sequence[Any] | None, reason: str | None, detail: str | None, include_data: bool,
                    _call_data: Sequence[Any] | None) -> None:
    notes: list[str] = []
    summary: dict[str, Any] = {"id": did, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "reason": reason, "detail": detail, "pid": os.getpid(), "argv": sys.argv, "notes": notes}

    def section(name: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as e:  # one broken section must not cost the others
            notes.append(f"{name}: could not be written: {type(e).__name__}: {e}")
            return None

    rel_root, loaded = _release_root(release)
    summary["release_path"] = str(rel_root) if rel_root else None
    summary["release_id"] = (getattr(loaded, "release_id", None)
                             or section("manifest.json", lambda: _manifest_id(rel_root)))
    rel_json = section("release.json", lambda: _json_file(rel_root / "release.json")) if rel_root else None
    specs = _safe([spec_id], notes) if spec_id else _troubled_specs(rel_json, loaded, notes)
    summary["spec_ids"] = specs
    if exc is not None:
        summary["exception"] = {"type": type(exc).__name__, "message": str(exc)}
        section("traceback", lambda: (root / "traceback.txt").write_text("".join(traceback.format_exception(exc))))
    if call is not None:
        summary["call"] = section("call", lambda: describe_call(call, loaded, specs))
        section("call.json", lambda: _write_json(root / "call.json", summary["call"]))
        if include_data:
            section("call_data",
                    lambda: _save_data(_call_data if _call_data is not None else call, root / "call_data.pt"))
    summary["data_included"] = bool(call is not None and include_data and (root / "call_data.pt").exists())
    if loaded is not None:
        section("runtime", lambda: _write_json(root / "runtime.json", _runtime_view(loaded)))
    section("environment", lambda: _environment(root / "environment", rel_root, loaded))
    tools = {t: shutil.which(t) for t in ("nvidia-smi", "cuobjdump", "nvdisasm")}
    summary["tools"] = tools
    section("nvidia-smi", lambda: (root / "nvidia-smi.txt").write_text(
        _run([tools["nvidia-smi"], "-q"]) if tools["nvidia-smi"]
        else "nvidia-smi is not on PATH: no GPU driver tools on this machine\n"))
    if rel_root is not None:
        build_log = section("build-log.json", lambda: _json_file(rel_root / "build-log.json")) or {}
        for sid in specs:
            def one(sid: str = sid, rr: Path = rel_root) -> None:
                _spec(root / "specs" / sid, rr, sid, rel_json, build_log, loaded, tools, notes)

            section(f"specs/{sid}", one)
    summary["files"] = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) + ["summary.json"]
    _write_json(root / "summary.json", summary)


def check_release(release: Any, *, out_dir: Path | str | None = None) -> DiagnosticsRef | None:
    """After a load: a bundle when artifacts failed to load or the lock drifted (blocking), else None."""
    reasons = []
    if release.load_errors:
        reasons.append("load_failed")
    if release.drift.blocking:
        reasons.append("drift")
    if not reasons:
        return None
    problems = [f"{s}: {e}" for s, e in sorted(release.load_errors.items())]
    if release.drift.blocking:
        problems.append("drift: " + release.drift.reason)
    detail = "; ".join(problems)
    ref = capture(release, out_dir=out_dir, reason="+".join(reasons), detail=detail, exc=None)
    _log.warning("release %s: %s; diagnostics %s at %s", release.release_id, "+".join(reasons), ref.id, ref.path)
    return ref


def capture_build(release_dir: Path | str, *, out_dir: Path | str | None = None) -> DiagnosticsRef | None:
    """After a build: one bundle for the specializations that failed to compile, else None."""
    rel = json.loads((Path(release_dir) / "release.json").read_text())
    failed = sorted(s for s, i in rel["specializations"].items() if i.get("status") != "built")
    if not failed:
        return None
    return capture(Path(release_dir), out_dir=out_dir, reason="build_failed", exc=None,
                   detail=f"{len(failed)} specializations failed to compile: {', '.join(failed)}")


class FaultRecorder:
    """An ``OpRunner.on_fault`` hook that writes a bundle per tripped specialization.

    The call's metadata (and data, if opted in) is taken synchronously; the bundle is written
    on a background thread so the request the reference is answering is not held up.
    ``refs`` maps specialization id -> the latest DiagnosticsRef; ``wait()`` joins writers.
    """

    def __init__(self, release: Any, *, out_dir: Path | str | None = None, include_data: bool = False,
                 also: Callable[[Any, str, str, DiagnosticsRef], Any] | None = None) -> None:
        self.release = release
        self.out_dir = out_dir
        self.include_data = include_data
        self.also = also
        self.refs: dict[str, DiagnosticsRef] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def __call__(self, entry: Any, reason: str, detail: str) -> None:
        from tileship.runtime.dispatch import fault_args

        sid = entry.decision.spec_id
        args = fault_args()
        call = data = None
        if args is not None:
            call = describe_call(args, self.release, [sid])
            data = [_clone(a) for a in args] if self.include_data else None
        exc = sys.exc_info()[1]
        base = Path(self.out_dir) if self.out_dir is not None else default_dir()
        did = new_id()
        ref = DiagnosticsRef(did, base / did, base / f"{did}.tar.gz")
        with self._lock:
            self.refs[sid] = ref
        _log.warning("circuit open on %s (%s): diagnostics %s", sid, detail, did)
        t = threading.Thread(target=self._write, args=(sid, reason, detail, exc, call, data, did),
                             name=f"diagnostics-{did}", daemon=True)
        with self._lock:
            self._threads.append(t)
        t.start()
        if self.also is not None:
            self.also(entry, reason, detail, ref)

    def _write(self, sid: str, reason: str, detail: str, exc: BaseException | None, call: Any, data: Any,
               did: str) -> None:
        try:
            capture(self.release, spec_id=sid, exc=exc, call=call, out_dir=self.out_dir, reason=reason, detail=detail,
                    include_data=self.include_data, diag_id=did, _call_data=data)
        except Exception:
            _log.exception("could not write diagnostics %s", did)

    def wait(self, timeout: float | None = None) -> None:
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout)


def watch(release: Any, *, check_finite: bool = True, out_dir: Path | str | None = None, include_data: bool = False,
          also: Callable[[Any, str, str, DiagnosticsRef], Any] | None = None) -> FaultRecorder:
    """Arm the circuit breaker of every operator of ``release``: non-finite checks (when
    ``check_finite``) and a diagnostics bundle per tripped specialization. Returns the recorder."""
    recorder = FaultRecorder(release, out_dir=out_dir, include_data=include_data, also=also)
    for runner in release.ops.values():
        runner.check_finite = check_finite
        runner.on_fault = recorder
    return recorder
