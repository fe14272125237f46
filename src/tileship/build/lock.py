"""The lock: everything that decides what a release's artifacts mean, and drift against it.

``capture_environment()`` reads the running toolchain and device (without importing
TileLang). ``make_lock()`` adds the kernel revision, the declared shapes and fallbacks.
``write_lock()`` is deterministic: sorted keys, same environment -> byte-identical file.
``compare()`` classifies each difference as blocking (compiled artifacts are not trusted
here: the reference serves) or informational (recorded, explained, not blocking).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
import platform
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tileship.errors import LockError

LOCK_SCHEMA = 1
#: a container image digest, as ``lock --image-digest`` and ``publish --image-digest`` take it
IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
NATIVE_LIBS = ("libtilelang.so", "libtvm_runtime.so", "libtvm_compiler.so")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _run(cmd: list[str]) -> str | None:
    exe = shutil.which(cmd[0])
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def tilelang_lib_dir() -> Path | None:
    spec = importlib.util.find_spec("tilelang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


_ENV_CACHE: dict[str, Any] = {}


def capture_environment(*, refresh: bool = False) -> dict[str, Any]:
    """The running environment, as the lock records it. Cached per process (hashing libs costs ~1 s)."""
    if _ENV_CACHE and not refresh:
        return dict(_ENV_CACHE)
    libs: dict[str, str | None] = {}
    lib_dir = tilelang_lib_dir()
    for name in NATIVE_LIBS:
        p = lib_dir / name if lib_dir else None
        libs[name] = sha256_file(p) if p is not None and p.is_file() else None
    nvcc_out = _run(["nvcc", "--version"]) or ""
    m = re.search(r"release [\d.]+, V([\d.]+)", nvcc_out)
    cxx = (_run(["c++", "--version"]) or "").splitlines()
    torch_v = _version("torch")
    env: dict[str, Any] = {
        "framework": {
            "python": platform.python_version(),
            "torch": torch_v,
            "torch_cuda": _torch_cuda_version(),
        },
        "backend": {
            "tilelang": _version("tilelang"),
            "tilelang_native_libs": libs,
            "apache_tvm_ffi": _version("apache-tvm-ffi"),
            "z3_solver": _version("z3-solver"),
            "nvcc": m.group(1) if m else None,
            "host_cxx": cxx[0].strip() if cxx else None,
            "platform": f"{platform.system().lower()}-{platform.machine()}",
        },
        "gpu": _gpu(),
    }
    _ENV_CACHE.clear()
    _ENV_CACHE.update(env)
    return dict(env)


def _torch_cuda_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.version.cuda


def _gpu() -> dict[str, Any] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(0)
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return {
        "name": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "sm_count": p.multi_processor_count,
        "driver": smi.strip().splitlines()[0] if smi else None,
        "memory_mib": p.total_memory // (1 << 20),
    }


def kernel_revision(root: Path | None) -> str:
    """``<short commit>[-dirty]`` of the git tree holding the operator sources, or ``unversioned``."""
    cwd = str(root or Path.cwd())
    try:
        head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return "unversioned"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True,
                               text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unversioned"


def make_lock(*, env: Mapping[str, Any], revision: str, sources: Mapping[str, str],
              operators: Mapping[str, Mapping[str, Any]], targets: list[str], model: Mapping[str, str],
              image_digest: str | None = None,
              toolchain: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Assemble the lock mapping. ``operators`` are ``spec.describe()`` outputs by name. ``toolchain``
    (a build through ``tileship build --toolchain``): its wheels' names, versions and sha256."""
    if image_digest is not None and not IMAGE_DIGEST.fullmatch(image_digest):
        raise LockError(f"image digest {image_digest!r} is not sha256:<64 hex>",
                        hint="pass the digest your registry shows, e.g. sha256:3f5...")
    out = {
        "schema": LOCK_SCHEMA,
        "model": dict(model),
        "kernel_revision": revision,
        "kernel_sources": dict(sources),
        "framework": dict(env["framework"]),
        "backend": dict(env["backend"]),
        "device_arch": {"targets": sorted(targets), "gpu": env.get("gpu")},
        "shapes": {name: _shapes_entry(d) for name, d in operators.items()},
        "fallback": {name: f"tested-reference: {d['reference']}" for name, d in operators.items()},
        #: third-party modules each operator's reference (and its local imports) needs at serve time
        "reference_imports": {name: dict(d.get("reference_imports") or {}) for name, d in operators.items()},
        #: sha256 of every module each operator's reference runs from (``build.pins``): compared at load
        "reference_modules": {name: dict(d.get("reference_modules") or {}) for name, d in operators.items()},
        "image_digest": image_digest,
    }
    if toolchain:  # absent otherwise: a lock without one stays byte-identical to before
        out["toolchain"] = dict(toolchain)
    return out


def _shapes_entry(d: Mapping[str, Any]) -> dict[str, Any]:
    """An operator's accepted set; per-tensor dtypes and per-output tolerances only where declared
    (an operator with one dtype throughout locks exactly as before)."""
    out = {"dtypes": d["dtypes"], "targets": d["targets"], "shapes": d["shapes"], "ranges": d["ranges"],
           "config": d["config"], "tolerances": d["tolerances"]}
    literal = {n: dt for n, dt in (d.get("tensor_dtypes") or {}).items() if dt != "same"}
    if literal:
        out["tensor_dtypes"] = literal
    if d.get("output_tolerances"):
        out["output_tolerances"] = d["output_tolerances"]
    return out


def dump_lock(lock: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(lock), sort_keys=True, default_flow_style=False, allow_unicode=True, width=120)


def lock_digest(lock: Mapping[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(dump_lock(lock).encode()).hexdigest()


def write_lock(lock: Mapping[str, Any], path: Path) -> None:
    """Atomic: the old file stays whole until the new one is complete (and fsynced). A symlinked lock stays a
    link (its target is rewritten) and the file keeps its mode (``atomic_file.write_file``)."""
    from tileship.release.atomic_file import write_file

    write_file(path, dump_lock(lock))


#: a lock is kilobytes; a larger file is not one
LOCK_READ_LIMIT = 16 << 20


def read_lock(path: Path) -> dict[str, Any]:
    """The lock at ``path``. Raises LockError naming the file (and the field) for anything that is
    not a tileship lock: missing, not a regular file of at most LOCK_READ_LIMIT bytes (never blocks), not UTF-8
    YAML, nested too deeply, a section of the wrong type."""
    from tileship.build import lock_shape
    from tileship.release import small_file

    try:
        data = yaml.safe_load(small_file.read(Path(path), LOCK_READ_LIMIT).decode("utf-8"))
    except FileNotFoundError:
        raise LockError(f"no lock at {path}", hint="run `tileship lock` first") from None
    except OSError as exc:  # a FIFO, a device (a link to /dev/zero), a directory, past the limit: never read
        raise LockError(f"{path}: cannot read the lock: {exc.strerror or exc}") from None
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: not UTF-8, an integer past the digit limit
        raise LockError(f"{path} is not valid YAML: {str(exc)[:300]}") from None
    except RecursionError:
        raise LockError(f"{path} is not valid YAML: nested too deeply") from None
    if not isinstance(data, dict) or data.get("schema") != LOCK_SCHEMA:
        raise LockError(f"{path} is not a tileship lock (schema {LOCK_SCHEMA})")
    lock_shape.check(data, path)
    return data


# -- drift -------------------------------------------------------------------

@dataclass(frozen=True)
class Difference:
    field: str
    locked: Any
    current: Any
    blocking: bool
    consequence: str

    def line(self) -> str:
        tag = "BLOCKING" if self.blocking else "info"
        return f"[{tag}] {self.field}: locked {self.locked!r}, running {self.current!r}: {self.consequence}"


@dataclass(frozen=True)
class DriftReport:
    differences: tuple[Difference, ...]

    @property
    def blocking(self) -> bool:
        return any(d.blocking for d in self.differences)

    @property
    def reason(self) -> str:
        return "; ".join(d.field for d in self.differences if d.blocking) or "none"

    def to_json(self) -> dict[str, Any]:
        return {"blocking": self.blocking, "differences": [d.__dict__ for d in self.differences]}


#: field -> (blocking?, consequence). Why: compiled artifacts are native code produced by
#: TileLang + TVM; a different TileLang, native lib or TVM-FFI may change the ABI or the
#: codegen the evidence was taken on. Python, torch, nvcc, z3, the C++ compiler and the
#: driver are not inside the artifacts: they change how references compute or how a
#: rebuild would compile, so they are reported, not blocking.
RULES: dict[str, tuple[bool, str]] = {
    "backend.tilelang": (True, "artifacts were compiled by another TileLang: compiled artifacts are not trusted; "
                               "serving will use the reference"),
    "backend.tilelang_native_libs": (True, "hash differs: compiled artifacts are not trusted; "
                                           "serving will use the reference"),
    "backend.apache_tvm_ffi": (True, "the kernels' FFI ABI may differ: compiled artifacts are not trusted; "
                                     "serving will use the reference"),
    "backend.platform": (True, "artifacts are native code for another platform: serving will use the reference"),
    "backend.z3_solver": (False, "used only while compiling: a rebuild may differ; served artifacts unaffected"),
    "backend.nvcc": (False, "used only while compiling: a rebuild may produce other code; served artifacts unaffected"),
    "backend.host_cxx": (False, "used only while compiling host wrappers: a rebuild may differ; "
                                "served artifacts unaffected"),
    "framework.python": (False, "artifacts carry no Python ABI; reference and glue run on this Python"),
    "framework.torch": (False, "the reference path runs on this torch: its numerics and speed may differ; re-verify"),
    "framework.torch_cuda": (False, "the reference path's CUDA libraries differ; re-verify"),
    "gpu.compute_capability": (True, "the GPU arch differs from the one locked: compiled artifacts are not trusted; "
                                     "serving will use the reference"),
    "gpu.name": (False, "another GPU model of the same arch: verification evidence may not transfer"),
    "gpu.sm_count": (False, "another SM count: speed evidence may not transfer"),
    "gpu.driver": (False, "another driver: recorded evidence was taken on a different driver"),
    "gpu.memory_mib": (False, "another memory size"),
}


def compare(lock: Mapping[str, Any], env: Mapping[str, Any]) -> DriftReport:
    """Differences between ``lock`` and the running ``env`` (from capture_environment)."""
    diffs: list[Difference] = []

    def add(field: str, locked: Any, current: Any) -> None:
        if locked == current:
            return
        rule = RULES[field]
        if field == "backend.tilelang_native_libs":
            for lib in sorted(set(locked or {}) | set(current or {})):
                a, b = (locked or {}).get(lib), (current or {}).get(lib)
                if a != b:
                    diffs.append(Difference(f"{field}.{lib}", a, b, True, f"{lib} {rule[1]}"))
            return
        diffs.append(Difference(field, locked, current, rule[0], rule[1]))

    for section in ("backend", "framework"):
        for key in sorted(set(lock.get(section, {})) | set(env.get(section, {}))):
            field = f"{section}.{key}"
            if field in RULES:
                add(field, lock.get(section, {}).get(key), env.get(section, {}).get(key))
    locked_gpu = (lock.get("device_arch") or {}).get("gpu")
    gpu = env.get("gpu")
    if locked_gpu and gpu:
        for key in ("compute_capability", "name", "sm_count", "driver", "memory_mib"):
            add(f"gpu.{key}", locked_gpu.get(key), gpu.get(key))
    return DriftReport(tuple(diffs))
