"""Diagnostics sections: each part of a diagnostics bundle (environment, specialization, call data) and its writers.

Used by ``diagnostics.capture``; each writer works on plain files and never touches the CUDA
context.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

TOOL_TIMEOUT_S = 30.0
#: the most bytes of one release file read into a bundle (a manifest lists every file: megabytes)
READ_LIMIT = 64 << 20


def describe_call(args: Iterable[Any], release: Any = None, specs: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Metadata of a call's tensors (never their values); names them when the operator is known."""
    names: list[str] = []
    if release is not None and specs and hasattr(release, "ops"):
        op = specs[0].split(".", 1)[0]
        if op in release.ops:
            names = [n for n, _ in release.ops[op].shape.inputs]
    out = []
    for i, a in enumerate(args):
        if isinstance(a, dict):  # already described
            out.append(a)
            continue
        d: dict[str, Any] = {"index": i, "name": names[i] if i < len(names) else None, "type": type(a).__name__}
        for attr in ("shape", "dtype", "device"):
            if hasattr(a, attr):
                v = getattr(a, attr)
                d[attr] = list(v) if attr == "shape" else str(v)
        if hasattr(a, "stride") and callable(a.stride):
            d["stride"] = list(a.stride())
            d["contiguous"] = bool(a.is_contiguous())
        out.append(d)
    return out


# -- sections ------------------------------------------------------------------------

def _release_root(release: Any) -> tuple[Path | None, Any]:
    if release is None:
        return None, None
    if isinstance(release, (str, os.PathLike)):
        return Path(release), None
    return (Path(release.path) if getattr(release, "path", None) else None), release


def _json_file(path: Path) -> Any:
    """``path`` parsed as JSON, read as hostile input: never blocks (a FIFO), never reads past READ_LIMIT (a
    link to ``/dev/zero``). Raises OSError or BundleIntegrityError naming the file."""
    from tileship.release import small_file, strict_json

    return strict_json.loads(small_file.read(path, READ_LIMIT), path)


def _manifest_id(root: Path | None) -> str | None:
    if root is None:
        return None
    data = _json_file(root / "manifest.json")
    if not isinstance(data, dict):
        raise ValueError(f"{root / 'manifest.json'}: not an object")
    return str(data.get("release_id"))


def safe_spec_id(sid: Any) -> bool:
    """Whether ``sid`` names a specialization folder: one path component (a hostile release.json may list
    ``../x`` or ``/abs``, which a bundle must never write to or copy from)."""
    return (isinstance(sid, str) and sid not in ("", ".", "..") and "/" not in sid and "\\" not in sid
            and "\0" not in sid)


def _troubled_specs(rel_json: Any, loaded: Any, notes: list[str]) -> list[str]:
    table = rel_json.get("specializations", {}) if isinstance(rel_json, dict) else {}
    if not isinstance(table, dict):
        notes.append(f"release.json: specializations is a {type(table).__name__}, not an object")
        table = {}
    bad = {s for s, i in table.items() if not isinstance(i, dict) or i.get("status") != "built"}
    if loaded is not None:
        bad |= set(loaded.load_errors)
        bad |= {e.decision.spec_id for r in loaded.ops.values() for e in r.entries
                if e.decision.reason in ("circuit_open", "load_failed") and e.decision.spec_id}
    return _safe(sorted(bad) or sorted(table), notes)


def _safe(specs: Sequence[str], notes: list[str]) -> list[str]:
    for sid in specs:
        if not safe_spec_id(sid):
            notes.append(f"{sid[:200]!r}: not a specialization id (a path): left out")
    return [sid for sid in specs if safe_spec_id(sid)]


def _runtime_view(release: Any) -> dict[str, Any]:
    return {
        "status": release.status(),
        "decisions": release.decisions(),
        "counters": release.counters(),
        "load_seconds": {k: round(v, 6) for k, v in release.load_seconds.items()},
        "details": {e.decision.spec_id: e.detail for r in release.ops.values() for e in r.entries if e.detail},
        "faults": {name: dict(getattr(r, "faults", {})) for name, r in release.ops.items()},
    }


def _environment(dest: Path, rel_root: Path | None, loaded: Any) -> None:
    from tileship.build.lock import capture_environment, compare, dump_lock, read_lock

    dest.mkdir(parents=True, exist_ok=True)
    current = capture_environment()
    (dest / "current.yaml").write_text(dump_lock(current))
    lock = dict(loaded.lock) if loaded is not None else (read_lock(rel_root / "tileship.lock") if rel_root else None)
    if lock is None:
        (dest / "side_by_side.txt").write_text("no release lock to compare with\n")
        return
    (dest / "lock.yaml").write_text(dump_lock(lock))
    report = compare(lock, current)
    locked = _flatten({"framework": lock.get("framework"), "backend": lock.get("backend"),
                       "gpu": (lock.get("device_arch") or {}).get("gpu")})
    running = _flatten({"framework": current.get("framework"), "backend": current.get("backend"),
                        "gpu": current.get("gpu")})
    width = max((len(k) for k in {**locked, **running}), default=10)
    lines = [f"{'field':<{width}}  {'locked':<44}  running", "-" * (width + 60)]
    for k in sorted(set(locked) | set(running)):
        a, b = locked.get(k), running.get(k)
        mark = "" if a == b else "   <-- differs"
        lines.append(f"{k:<{width}}  {_short(a):<44}  {_short(b)}{mark}")
    lines += ["", f"blocking drift: {report.blocking} ({report.reason})", *(d.line() for d in report.differences)]
    (dest / "side_by_side.txt").write_text("\n".join(lines) + "\n")


def _spec(dest: Path, rel_root: Path, sid: str, rel_json: dict[str, Any] | None, build_log: dict[str, Any], loaded: Any,
          tools: dict[str, str | None], notes: list[str]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    src = rel_root / "specs" / sid
    for name in ("device_kernel.cu", "host_kernel.cu", "artifact.json", "params.json"):
        if (src / name).is_file():
            shutil.copyfile(src / name, dest / name)
    info = _entry(rel_json, sid)
    log = _entry(build_log, sid)
    build = {"release_status": info, "build": log}
    if loaded is not None:
        build["load_error"] = loaded.load_errors.get(sid)
        for r in loaded.ops.values():
            for e in r.entries:
                if e.decision.spec_id == sid:
                    build["decision"] = f"{e.decision.path}:{e.decision.reason}"
                    build["detail"] = e.detail
    _write_json(dest / "build.json", build)
    if info is None and log is None:
        notes.append(f"{sid}: not a specialization of this release")
    cubin = src / "kernel.cubin"
    if not cubin.is_file():
        notes.append(f"{sid}: no kernel.cubin in the release (CPU target or not built): no SASS/PTX")
        return
    if tools.get("cuobjdump"):
        (dest / "sass.txt").write_text(_run([tools["cuobjdump"], "-sass", str(cubin)]))
        (dest / "ptx.txt").write_text(_run([tools["cuobjdump"], "-ptx", str(cubin)]))
    elif tools.get("nvdisasm"):
        (dest / "sass.txt").write_text(_run([tools["nvdisasm"], str(cubin)]))
        notes.append(f"{sid}: cuobjdump absent: SASS from nvdisasm, no PTX")
    else:
        notes.append(f"{sid}: neither cuobjdump nor nvdisasm on PATH: no SASS/PTX (kernel.cubin is in the release)")


def _entry(doc: Any, sid: str) -> Any:
    table = doc.get("specializations") if isinstance(doc, dict) else None
    return table.get(sid) if isinstance(table, dict) else None


def _run(cmd: list[Any]) -> str:
    try:
        p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"$ {' '.join(map(str, cmd))}\n(timed out after {TOOL_TIMEOUT_S:g} s)\n"
    except OSError as exc:
        return f"$ {' '.join(map(str, cmd))}\n(could not run: {exc})\n"
    return f"$ {' '.join(map(str, cmd))}\n(exit status {p.returncode})\n{p.stdout}{p.stderr}"


def _clone(a: Any) -> Any:
    try:
        return a.detach().to("cpu", copy=True)
    except Exception as exc:  # e.g. a poisoned CUDA context: keep the metadata
        d = describe_call([a])[0]
        d["data_error"] = f"{type(exc).__name__}: {exc}"
        return d


def _save_data(call: Sequence[Any], path: Path) -> None:
    import torch

    tensors = [a if isinstance(a, dict) else _clone(a) for a in call]
    torch.save([t for t in tensors if not isinstance(t, dict)], path)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 44 else s[:41] + "..."


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def _tar(root: Path, archive: Path) -> None:
    """``root`` as ``archive``, written to a temporary of its own (``archive_tmp``) and renamed onto it once whole."""
    from tileship.release.diagnostics_queue import archive_tmp

    tmp = archive_tmp(archive)
    try:
        with tarfile.open(tmp, "x:gz") as tar:
            tar.add(root, arcname=root.name)
        os.replace(tmp, archive)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
