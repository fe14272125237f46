"""The hermetic build toolchain: a venv installed from a hash-locked requirements file.

``pins(lock)`` names what a build needs at the lock's versions: TileLang, apache-tvm-ffi,
z3-solver, ``torch==2.13.0`` and the CUDA compiler as wheels of the locked CUDA version
(``nvidia-cuda-nvcc`` / ``-crt`` / ``-runtime`` / ``-cccl`` and ``nvidia-nvvm``, which holds
``cicc``). ``compile_requirements`` resolves them with pip-tools into a file where every
distribution is ``==``-pinned with its sha256 (pip's resolver, so ``torch==2.13.0`` is the
CPU build on this machine's disk, never a CUDA build from the registry). ``create`` installs
that file with ``--require-hashes`` into a fresh venv and records each installed wheel's
name, version and sha256 in ``tileship-toolchain.json``: that record is what the lock
stores and what ``compare`` checks a toolchain against.

``Toolchain.worker_env`` is the environment a compile worker runs in: CUDA_HOME and PATH
point at the wheels' nvcc and headers; every PATH entry holding another nvcc is dropped.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tileship.build.lock import Difference
from tileship.errors import ToolchainError

#: nvcc version -> the CUDA wheels of that release (CUDA 13.0 Update 2; the same versions the
#: build host's /usr/local/cuda-13.0/dist-info records). nvcc needs nvvm (cicc) and crt.
CUDA_WHEELS: dict[str, dict[str, str]] = {
    "13.0.88": {"nvidia-cuda-nvcc": "13.0.88", "nvidia-cuda-crt": "13.0.88", "nvidia-cuda-runtime": "13.0.96",
                "nvidia-cuda-cccl": "13.0.85", "nvidia-nvvm": "13.0.88"},
}
DEFAULT_CUDA = "13.0.88"
#: the CPU build on this machine's disk; a range would make pip fetch a multi-GB CUDA build
TORCH_PIN = "torch==2.13.0"
#: what the compile worker imports beside TileLang (tileship itself comes from PYTHONPATH)
WORKER_DEPS = ("PyYAML", "filelock")
RECORD = "tileship-toolchain.json"
_DROP = ("VIRTUAL_ENV", "PYTHONHOME", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "TORCH_CUDA_ARCH_LIST")
_HASHED = re.compile(r"^([A-Za-z0-9_.\-]+)==(\S+) \\$")


def pins(lock: Mapping[str, Any], cuda: str | None = None) -> list[str]:
    """Top-level requirements for the toolchain of ``lock`` (sorted). Raises ToolchainError."""
    backend = lock.get("backend") or {}
    cuda = cuda or backend.get("nvcc") or DEFAULT_CUDA
    if cuda not in CUDA_WHEELS:
        raise ToolchainError(f"no CUDA wheels known for nvcc {cuda}",
                             hint=f"use --cuda with one of: {', '.join(sorted(CUDA_WHEELS))}")
    out = [TORCH_PIN, *(f"{n}=={v}" for n, v in CUDA_WHEELS[cuda].items())]
    for dist, key in (("tilelang", "tilelang"), ("apache-tvm-ffi", "apache_tvm_ffi"), ("z3-solver", "z3_solver")):
        if not backend.get(key):
            raise ToolchainError(f"the lock records no {dist} version",
                                 hint="run `tileship lock` where TileLang is installed")
        out.append(f"{dist}=={backend[key]}")
    from importlib.metadata import version

    out += [f"{d}=={version(d)}" for d in WORKER_DEPS]
    return sorted(out, key=str.lower)


def cuda_of(requirements: str) -> str | None:
    """The nvcc version a requirements text pins, if any."""
    m = re.search(r"^nvidia-cuda-nvcc==(\S+)", requirements, re.M)
    return m.group(1) if m else None


def compile_requirements(top: list[str], out: Path, *, timeout_s: float = 900) -> str:
    """Resolve ``top`` with pip-tools into ``out``: every distribution ``==``-pinned, with hashes.

    Raises ToolchainError when pip-tools is missing or the resolution fails. pip-compile writes a
    temporary of this call's own beside ``out`` (seeded with ``out``, so its pins are kept where they still
    resolve), put in place only once it is complete and hash-locked (``atomic_file.write_file``: through a symlink,
    keeping the file's mode): a failed or killed resolution leaves the previous file whole."""
    import shutil

    from tileship.release.atomic_file import temporary, write_file

    out.parent.mkdir(parents=True, exist_ok=True)
    # temporaries of this call's own: calls in threads of one process at once never resolve into one file
    src, tmp = temporary(out.with_name(out.name + ".in")), temporary(out)
    src.write_text("\n".join(top) + "\n")
    if out.is_file():
        shutil.copyfile(out, tmp)
    cmd = [sys.executable, "-m", "piptools", "compile", "--generate-hashes", "--allow-unsafe", "--strip-extras",
           "--no-header", "--no-annotate", "--no-emit-index-url", "--no-emit-find-links", "--quiet",
           "--output-file", str(tmp), str(src)]
    try:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except FileNotFoundError as exc:
            raise ToolchainError(f"cannot run pip-tools: {exc}") from exc
        if proc.returncode != 0:
            hint = "pip install pip-tools==7.6.2" if "No module named piptools" in proc.stderr else None
            raise ToolchainError(f"pip-compile failed: {_last_lines(proc.stderr)}" + (
                f" (exit status {proc.returncode})" if not proc.stderr.strip() else ""), hint=hint)
        text = tmp.read_text()
        problems = check_hashed(text)
        if problems:
            raise ToolchainError(f"{out}: the resolution is not fully hash-locked: {'; '.join(problems)}")
        write_file(out, text)  # whole; a symlinked file stays a link, the file keeps its mode
    finally:
        src.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return text


def check_hashed(text: str) -> list[str]:
    """What keeps ``text`` from being a hash-locked requirements file (empty when it is one)."""
    problems: list[str] = []
    name: str | None = None
    hashes = 0
    for line in [*text.splitlines(), ""]:
        s = line.strip()
        if s.startswith("--hash=sha256:") and name:
            hashes += 1 if re.fullmatch(r"--hash=sha256:[0-9a-f]{64}( \\)?", s) else 0
            continue
        if name is not None and hashes == 0:
            problems.append(f"{name} has no sha256")
        name, hashes = None, 0
        if not s or s.startswith("#"):
            continue
        m = _HASHED.match(s) or re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)$", s)
        if m is None:
            problems.append(f"{s!r} is not pinned with ==")
        else:
            name = m.group(1)
    return problems


@dataclass(frozen=True)
class Toolchain:
    """A toolchain venv at ``root`` (it need not exist yet)."""

    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        return self.root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"

    @property
    def cuda_home(self) -> Path:
        return self.site_packages / "nvidia" / "cu13"

    @property
    def nvcc(self) -> Path:
        return self.cuda_home / "bin" / "nvcc"

    def record(self) -> dict[str, Any] | None:
        """The install record, or None when the venv is absent or its install never completed."""
        try:
            data = json.loads((self.root / RECORD).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def require(self) -> dict[str, Any]:
        """The record; raises ToolchainError when the toolchain is unusable for a build."""
        rec = self.record()
        if rec is None or not self.nvcc.is_file():
            raise ToolchainError(f"no complete toolchain at {self.root}", hint="run `tileship toolchain create`")
        drift = [d for d in compare(rec, self) if d.field.startswith("toolchain.installed")]
        if drift:
            raise ToolchainError(f"toolchain {self.root} was changed after its hash-checked install: {drift[0].line()}",
                                 hint="recreate it: `tileship toolchain create --force`")
        return rec

    def installed(self) -> dict[str, str]:
        """Distribution name (normalized) -> version, read from the venv's dist-info folders."""
        out: dict[str, str] = {}
        for meta in self.site_packages.glob("*.dist-info/METADATA"):
            fields = dict(re.findall(r"^(Name|Version): (.+)$", meta.read_text(errors="replace")[:4000], re.M))
            if "Name" in fields:
                out[_norm(fields["Name"])] = fields.get("Version", "").strip()
        return out

    def nvcc_version(self) -> str | None:
        try:
            out = subprocess.run([str(self.nvcc), "--version"], capture_output=True, text=True, timeout=30).stdout
        except OSError:
            return None
        m = re.search(r"release [\d.]+, V([\d.]+)", out)
        return m.group(1) if m else None

    def worker_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a compile worker: the wheels' nvcc first, no other nvcc on PATH."""
        # TileLang exports its own paths on import (TL_TEMPLATE_PATH, TVM_LIBRARY_PATH, ...): a parent that
        # imported it would point the worker at the parent's TileLang headers, so those never pass.
        env = {k: v for k, v in (base if base is not None else os.environ).items()
               if k not in _DROP and not k.startswith(("TL_", "TVM_", "PIP_"))}
        parent = str(Path(sys.prefix).resolve())
        keep = [p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep)
                if p and not (Path(p) / "nvcc").exists() and not str(Path(p).resolve()).startswith(parent + os.sep)]
        env["PATH"] = os.pathsep.join([str(self.cuda_home / "bin"), str(self.root / "bin"), *keep])
        env["CUDA_HOME"] = env["CUDA_PATH"] = str(self.cuda_home)
        env["VIRTUAL_ENV"] = str(self.root)
        env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent.parent)  # tileship itself, nothing else
        env["PYTHONNOUSERSITE"] = "1"
        return env

    def capture_environment(self) -> dict[str, Any]:
        """``lock.capture_environment()`` as seen from inside the toolchain (its TileLang, its nvcc)."""
        code = "import json; from tileship.build.lock import capture_environment as c; print(json.dumps(c()))"
        proc = subprocess.run([str(self.python), "-c", code], capture_output=True, text=True,
                              env=self.worker_env(), timeout=300)
        if proc.returncode != 0:
            raise ToolchainError(f"the toolchain at {self.root} cannot run tileship: {_last_lines(proc.stderr)}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def create(root: Path, requirements: Path, *, python: str | None = None) -> Toolchain:
    """A fresh venv at ``root`` installed from ``requirements`` with ``--require-hashes``.

    Built beside ``root`` and put in its place only once complete, its record written and its python
    run there (``toolchain_place``): a refused install (a hash mismatch), a failure or a kill leaves the
    toolchain that was at ``root`` (or none) whole, and the next create removes what a killed one left.
    Raises ToolchainError naming pip's complaint."""
    import shutil

    from tileship.build import toolchain_place

    text = requirements.read_text()
    problems = check_hashed(text)
    if problems:
        raise ToolchainError(f"{requirements} is not hash-locked: {'; '.join(problems)}",
                             hint="regenerate it with `tileship toolchain lock`")
    staged = toolchain_place.staging(root)
    try:
        _install(staged, requirements, text, python)
        toolchain_place.relocate(staged, root)
        toolchain_place.install(staged, root)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return Toolchain(root)


def _install(root: Path, requirements: Path, text: str, python: str | None) -> None:
    """Make the venv at ``root`` (absent) and install ``requirements`` (whose content is ``text``) into it,
    then write its record (last, and whole: a venv without one is no usable toolchain)."""
    base = python or getattr(sys, "_base_executable", None) or sys.executable  # not a venv of this venv
    made = subprocess.run([base, "-m", "venv", str(root)], capture_output=True, text=True)
    if made.returncode != 0:
        raise ToolchainError(f"`{base} -m venv {root}` failed: {_last_lines(made.stderr)}")
    tc = Toolchain(root)
    report = root / "install-report.json"
    proc = subprocess.run([str(tc.python), "-m", "pip", "install", "--quiet", "--no-input",
                           "--disable-pip-version-check",
                           "--require-hashes", "--no-deps", "--only-binary", ":all:", "--report", str(report), "-r",
                           str(requirements)],
                          capture_output=True, text=True, env={**os.environ, "PIP_NO_WARN_SCRIPT_LOCATION": "1"})
    if proc.returncode != 0:
        raise ToolchainError(f"hash-checked install of {requirements} failed: {_last_lines(proc.stderr, 12)}",
                             hint="a hash mismatch means the file on the index is not the one locked: do not edit the "
                                  "hash")
    wheels = {}
    for item in json.loads(report.read_text())["install"]:
        info = item["download_info"]
        wheels[_norm(item["metadata"]["name"])] = {
            "version": item["metadata"]["version"],
            "sha256": "sha256:" + info["archive_info"]["hashes"]["sha256"],
            "file": info["url"].rsplit("/", 1)[-1].replace("%2B", "+"),
        }
    digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    rec = {"cuda": cuda_of(text), "requirements": digest, "wheels": dict(sorted(wheels.items()))}
    from tileship.release.bundle import write_json_atomic

    write_json_atomic(root / RECORD, rec)  # last, and whole: a killed install leaves no record


#: wheel -> what changes when it differs
_CONSEQUENCE = {
    "compiler": "another CUDA compiler or headers: a rebuild would not reproduce this release's kernels byte for byte",
    "tilelang": "another TileLang/TVM-FFI: a rebuild generates other code, and the lock's artifacts would not be "
                "trusted",
    "other": "another build-time dependency: a rebuild may differ from this release",
}


def compare(locked: Mapping[str, Any] | None, tc: Toolchain | None) -> list[Difference]:
    """How the toolchain at ``tc`` differs from ``locked`` (a lock's ``toolchain`` entry or a
    record). Informational for serving (the artifacts are already built); each difference
    says what it means for a rebuild. Empty when they match."""
    if not locked:
        return []
    rec = tc.record() if tc is not None else None
    if rec is None:
        where = tc.root if tc is not None else "(none given)"
        return [Difference("toolchain", f"cuda {locked.get('cuda')}", None, False,
                           f"no toolchain at {where}: a rebuild here would use the system's nvcc and packages, not the "
                           "locked "
                           "wheels, so it is not hermetic; run `tileship toolchain create`")]
    diffs: list[Difference] = []
    if rec.get("requirements") != locked.get("requirements"):
        diffs.append(Difference("toolchain.requirements", locked.get("requirements"), rec.get("requirements"), False,
                                "installed from another requirements file"))
    want, have = locked.get("wheels") or {}, rec.get("wheels") or {}
    for name in sorted(set(want) | set(have)):
        a, b = want.get(name), have.get(name)
        fa = f"{a['version']} {a['sha256']}" if a else None
        fb = f"{b['version']} {b['sha256']}" if b else None
        kind = "compiler" if name.startswith("nvidia-") else "tilelang" if name in ("tilelang", "apache-tvm-ffi") \
            else "other"
        if fa != fb:
            diffs.append(Difference(f"toolchain.wheels.{name}", fa, fb, False, _CONSEQUENCE[kind]))
    installed = tc.installed() if tc is not None else {}
    for name, w in sorted(have.items()):
        if installed.get(name) != w["version"]:
            diffs.append(Difference(f"toolchain.installed.{name}", w["version"], installed.get(name), False,
                                    "the venv was changed after its hash-checked install: recreate it"))
    nvcc = tc.nvcc_version() if tc is not None else None
    if locked.get("cuda") and nvcc != locked.get("cuda"):
        diffs.append(Difference("toolchain.nvcc", locked.get("cuda"), nvcc, False, _CONSEQUENCE["compiler"]))
    return diffs


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _last_lines(text: str, n: int = 6) -> str:
    lines = [x for x in text.strip().splitlines() if "is ignored: it is neither" not in x]
    return " | ".join(lines[-n:]) or "(no output)"
