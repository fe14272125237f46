"""Compile ONE specialization in its own process: ``python -m tileship.build.worker JOB.json``.

Run by ``build`` under a timeout, so a crash or a hang here never takes the build down.
Writes the artifact files into ``job["out"]`` and a JSON result on the last stdout line.
Every subprocess TileLang starts (nvcc, the host C++ compiler) is recorded with its full
command line, so a failure can be reproduced by hand. Two builds of the same inputs give the
same bytes: temp-file names are seeded by the specialization id, and every source file a
command names gets a fixed mtime before the compiler runs (nvcc's line table records it).
"""

from __future__ import annotations

import glob
import importlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from tileship import tilelang_version
from tileship.errors import COMPILER_FAILED, build_summary

# before TileLang is imported: a release outside the supported range fails here, naming both versions
tilelang_version.check()

COMMANDS: list[list[str]] = []
_orig_popen_init = subprocess.Popen.__init__


#: the modification time every compiler input is given before the compiler runs: nvcc's
#: ``-lineinfo`` (always on in TileLang) writes each source file's mtime into the cubin's line
#: table, so two builds of the same inputs a second apart would differ byte-wise
SOURCE_MTIME = 315532800  # 1980-01-01, the zip epoch
SOURCE_SUFFIXES = (".cu", ".cuh", ".c", ".cc", ".cpp", ".cxx", ".h", ".hpp")


def pin_source_mtimes(args: list[str]) -> None:
    """Set ``SOURCE_MTIME`` on every existing source file named in a command line."""
    for arg in args:
        if arg.endswith(SOURCE_SUFFIXES) and os.path.isfile(arg):
            os.utime(arg, (SOURCE_MTIME, SOURCE_MTIME))


def _recording_popen_init(self: Any, args: Any, *a: Any, **kw: Any) -> None:
    command = [str(x) for x in args] if isinstance(args, (list, tuple)) else [str(args)]
    COMMANDS.append(command)
    pin_source_mtimes(command)
    _orig_popen_init(self, args, *a, **kw)


class _SeededNames:
    """Deterministic temp-file names: compilers embed the source file name in the objects,
    so random names would make two builds of the same inputs differ byte-wise."""

    characters = "abcdefghijklmnopqrstuvwxyz0123456789_"

    def __init__(self, seed: str) -> None:
        self.rng = random.Random(seed)

    def __iter__(self) -> _SeededNames:
        return self

    def __next__(self) -> str:
        return "".join(self.rng.choice(self.characters) for _ in range(8))


def find_operator(module: str, name: str) -> Any:
    """The module-level ``Operator`` called ``name`` in ``module`` (the declaring module), with its
    outputs read from the kernel when the declaration omits them. Raises BuildError naming both."""
    from tileship.declare.outputs import infer_outputs
    from tileship.declare.spec import Operator
    from tileship.errors import BuildError

    mod = importlib.import_module(module)
    found = [v for v in vars(mod).values() if isinstance(v, Operator)]
    op = next((v for v in found if v.name == name), None)
    if op is None:
        raise BuildError(f"module {module} declares no Operator named {name!r} (it declares: "
                         f"{', '.join(sorted(v.name for v in found)) or 'none'})",
                         hint="declare the Operator at module level in a module the project lists")
    return infer_outputs(op) if op.infers_outputs else op


_SOURCE_NAME = re.compile(r'("type": "ir\.SourceName",\s*"data": )("(?:[^"\\]|\\.)*")')


def _portable(saved: str) -> str:
    """TVM's JSON with every span's source file (``ir.SourceName``, an absolute path) written as
    its module-relative path (``tileship/catalog/cpu.py``): the artifacts, and so the release id,
    do not depend on where the checkout, the venv or a Ray node keeps the operator's sources."""
    from tileship.declare.factory import module_relative

    files = {os.path.realpath(f): name for name, m in list(sys.modules.items())
             if isinstance(f := getattr(m, "__file__", None), str)}

    def rel(m: re.Match[str]) -> str:
        path = json.loads(m.group(2))
        if not os.path.isabs(path):
            return m.group(0)
        mod = files.get(os.path.realpath(path))
        new = module_relative(path, mod) if mod else os.path.basename(path)
        return m.group(1) + json.dumps(new).replace("/", "\\/")

    return _SOURCE_NAME.sub(rel, saved)


def _die_with_parent(parent: int | None) -> None:
    """Linux: the kernel SIGKILLs this worker when the build that started it dies, kill -9 included. The worker
    runs in a session of its own (a build's timeout kills its whole group), so nothing else would stop it: an
    orphan would go on compiling and, at its end, remove the cache directory that the next build of the same
    specialization had taken over. Elsewhere, or where prctl is missing, nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:  # the build died before the request took effect
        os._exit(137)


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    _die_with_parent(job.get("parent"))
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(job["cache_dir"])
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    os.environ["TILELANG_CACHE_DIR"] = str(cache)
    tmp = cache / "tmp"
    tmp.mkdir()
    tempfile.tempdir = str(tmp)
    tempfile._name_sequence = _SeededNames(job["spec_id"])  # type: ignore[attr-defined]
    subprocess.Popen.__init__ = _recording_popen_init  # type: ignore[method-assign]
    t0 = time.perf_counter()
    result: dict[str, Any] = {"spec_id": job["spec_id"], "ok": False}
    try:
        import tilelang
        from tilelang import tvm

        from tileship.declare import c_target, contract
        from tileship.declare.factory import reconcile_out_idx, resolve, trace
        from tileship.declare.spec import Specialization, Target
        from tileship.runtime.signature import CALLEE_ALLOCATED_OUTPUTS

        if job.get("sys_path"):
            sys.path.insert(0, job["sys_path"])
        op = find_operator(job["module"], job["op"])
        if glob.glob(str(cache / "*" / "*" / "kernels" / "*")):  # nothing compiled yet: importing the module did
            from tileship.errors import BuildError
            from tileship.runtime.references import ON_IMPORT_HINT

            raise BuildError(f"{job['module']} (or a module it imports) compiled a TileLang kernel at import time; "
                             "operator modules must not compile on import", spec_id=job["spec_id"], hint=ON_IMPORT_HINT)
        spec = Specialization.from_json(job["spec"])
        info = resolve(op.factory, operator=op.name)
        func = trace(op, spec)
        out_idx, positions = reconcile_out_idx(op, info, func)
        contract.check(op, spec, func, positions)  # the kernel's parameters against the declaration
        c_target.check(spec, func)  # what the CPU "c" target cannot compile, said before the compiler fails on it
        c_target.check_host_scalars(spec, func)  # and a scalar the GPU targets' host wrapper cannot pass
        (out / "func.json").write_text(_portable(tvm.ir.save_json(func)))
        pass_configs = op.compile_pass_configs()
        kernel = tilelang.compile(func, out_idx=out_idx, target=Target(spec.target).tilelang(),
                                  pass_configs=pass_configs or None)
        # Whether the library allocates its outputs (tvm-ffi's callee-allocated ABI) is decided inside
        # the compile, from the execution backend: it is read back from the compiled kernel and
        # stamped on the signature (and named in artifact.json), never re-derived at load time.
        callee = bool(getattr(kernel.adapter, "_ffi_callee_allocated_output_abi", False)) and bool(positions)
        attrs = func.attrs
        if callee:
            attrs = func.with_attr(CALLEE_ALLOCATED_OUTPUTS, 1).attrs
        # The loader needs only the signature (params, buffer map, attrs); dropping the body
        # makes loading ~10x cheaper and means a release never re-traces the kernel.
        sig = tvm.tirx.PrimFunc(func.params, tvm.tirx.Evaluate(0), func.ret_type, func.buffer_map, attrs)
        sig_text = _portable(tvm.ir.save_json(sig))
        (out / "signature.json").write_text(sig_text)
        entries = glob.glob(str(cache / "*" / "*" / "kernels" / "*"))
        if not entries:  # TileLang logs a failed save ("Error during atomic cache save") and returns the kernel
            raise RuntimeError(f"TileLang compiled the kernel but saved no library (its host code's compile failed "
                               f"as it saved it: the log has it): {COMPILER_FAILED}")
        if len(entries) != 1:
            raise RuntimeError(f"expected one TileLang cache entry, found {len(entries)}")
        lib_name = None
        for f in sorted(Path(entries[0]).iterdir()):
            if f.name == "manifest.json":
                continue
            shutil.copyfile(f, out / f.name)
            if f.suffix == ".so":
                lib_name = f.name
        for cubin in glob.glob(str(cache / "*" / "cuda-binaries" / "*" / "kernel.cubin")):
            shutil.copyfile(cubin, out / "kernel.cubin")
        if lib_name is None:
            raise RuntimeError("TileLang produced no shared library")
        artifact = {
            "spec": spec.to_json(),
            "execution_backend": kernel.execution_backend,
            "library": lib_name,
            "out_idx": positions,
            "callee_allocated_outputs": callee,
            "target": spec.target,
            "pass_configs": dict(sorted(pass_configs.items())),
            "factory": info.to_json(),
            "tilelang": tilelang.__version__,
        }
        (out / "artifact.json").write_text(json.dumps(artifact, indent=2, sort_keys=True) + "\n")
        if kernel.execution_backend == "tvm_ffi":  # the loader's ABI check, here: a mismatch fails the build
            from tileship.runtime import artifact as runtime_artifact
            from tileship.runtime import signature as runtime_signature

            runtime_artifact.ffi_abi(out, artifact, runtime_signature.read(sig_text, positions), job["spec_id"])
        result.update(ok=True, backend=kernel.execution_backend)
    except BaseException as exc:  # report everything; the parent decides
        result.update(error=build_summary(exc), traceback=traceback.format_exc())
    finally:
        result["seconds"] = round(time.perf_counter() - t0, 3)
        result["commands"] = COMMANDS
        shutil.rmtree(cache, ignore_errors=True)
    sys.stdout.flush()
    print("\n" + json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
