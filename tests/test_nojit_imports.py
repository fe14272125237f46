"""No compile path is reachable from loading: a process that loads a CPU release and calls it has
imported none of TileLang's compile modules (issue 17, item 6).

Each check runs in a fresh interpreter (``sys.modules`` of the pytest process already holds TileLang).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SRC = str(TESTS.parent / "src")
#: TileLang's compile modules: the JIT and its kernel cache, every library generator, the lowering
#: engine, the autotuner, the compiler drivers of ``contrib`` and the compile-only tool
COMPILE_MODULES = (
    "tilelang.jit", "tilelang.jit.kernel", "tilelang.cache", "tilelang.cache.kernel_cache",
    "tilelang.jit.adapter.libgen", "tilelang.jit.adapter.nvrtc.libgen", "tilelang.jit.adapter.cutedsl.libgen",
    "tilelang.engine", "tilelang.engine.lower", "tilelang.autotuner", "tilelang.autotuner.tuner",
    "tilelang.autotuner.grouped_compile", "tilelang.contrib.nvcc", "tilelang.contrib.nvrtc",
    "tilelang.contrib.hipcc", "tilelang.contrib.bisheng", "tilelang.tools.compile_only",
)

CHILD = textwrap.dedent("""
    import json, sys, traceback
    import torch

    class Tracer:  # records who imports ``tilelang`` first (not who only looks it up); finds nothing itself
        first = None
        def find_spec(self, name, path=None, target=None):
            stack = [f"{f.filename}:{f.name}" for f in traceback.extract_stack()[:-1]]
            if name == "tilelang" and Tracer.first is None and any(f.endswith(":_find_and_load") for f in stack):
                Tracer.first = stack
            return None
    sys.meta_path.insert(0, Tracer())

    import tileship
    rel = tileship.load(sys.argv[1])
    calls = []
    for name, runner in sorted(rel.ops.items()):
        for entry in runner.entries:
            spec = entry.spec
            dims = {d: (v if isinstance(v, int) else min(v[-1], 333)) for d, v in spec.dims}
            desc = rel.declarations[name]
            args = tuple(0.5 if n in (desc.get("scalars") or ()) else
                         torch.randn([dims[d] for d in shape], dtype=getattr(torch, spec.dtype))
                         for n, shape, *_ in desc["inputs"])
            out, decision = runner.call(*args)
            ref = runner.reference(*args)
            ok = all(torch.allclose(o, r, atol=1e-4, rtol=1e-4) for o, r in zip(
                out if isinstance(out, (list, tuple)) else [out], ref if isinstance(ref, (list, tuple)) else [ref]))
            calls.append([spec.id, decision.path, decision.reason, ok])
    from tileship.runtime import nojit
    unguarded = []
    for m, a in nojit.GUARDED:
        obj = sys.modules.get(m)
        if obj is not None:
            for part in a.split("."):
                obj = getattr(obj, part)
            if not getattr(obj, "_tileship_guard", False):
                unguarded.append(f"{m}.{a}")
    tl = sorted(m for m in sys.modules if m == "tilelang" or m.startswith("tilelang."))
    print(json.dumps({"calls": calls, "tilelang": tl, "first_import": Tracer.first,
                      "unguarded": unguarded}))
""")


def run_child(release: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, str(TESTS)])}
    r = subprocess.run([sys.executable, "-c", CHILD, str(release)], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def lazy_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import Project, load_operators

    proj = Project(model="lazy", model_version="1", operator_modules=("lazy_ops",), targets=("c",), root=TESTS)
    res = build(proj, load_operators(proj), tmp_path_factory.mktemp("lazy"), BuildOptions(jobs=2))
    assert res.ok, [(r.spec.id, r.error) for r in res.failed]
    return res.path


def test_loading_and_calling_a_cpu_release_imports_no_tilelang_module(lazy_release: Path) -> None:
    """Operators whose module imports TileLang only in the factory: after load and a call of every
    specialization on the kernel path (a by-value scalar, a dynamic dim, the adapter-free launcher),
    not one ``tilelang`` module is in ``sys.modules``, compile modules or any other."""
    got = run_child(lazy_release)
    assert got["calls"] and all(path == "kernel" and ok for _, path, _, ok in got["calls"]), got["calls"]
    assert got["tilelang"] == [], f"loading imported TileLang: {got['tilelang'][:20]} (first by {got['first_import']})"


def test_the_catalog_imports_tilelang_through_its_operator_module_only(cpu_release: Path) -> None:
    """The built-in CPU catalog's module imports ``tilelang.language`` at its top (the ``@T.prim_func``
    factories sit next to the references), and importing any ``tilelang`` submodule runs
    ``tilelang/__init__``, which imports its compile modules: that import, made by the shipped
    operator module (the snapshot's copy, or the installed package's one the pins compare) when the
    reference is imported, is the only one; the loader's own code never
    makes it, and the guard patches each compile module as it arrives."""
    got = run_child(cpu_release)
    assert got["calls"] and all(path == "kernel" and ok for _, path, _, ok in got["calls"]), got["calls"]
    stack = got["first_import"]
    assert stack is not None
    importer = next(f for f in reversed(stack) if "importlib" not in f and "runtime/nojit.py" not in f)
    assert importer.endswith("tileship/catalog/cpu.py:<module>"), stack[-8:]
    assert any("references.py" in f for f in stack), stack[-8:]
    assert not any(f.rsplit(":", 1)[0].endswith(("runtime/artifact.py", "runtime/signature.py"))
                   for f in stack), stack
    loaded = set(COMPILE_MODULES) & set(got["tilelang"])
    assert {"tilelang.jit.kernel", "tilelang.engine.lower", "tilelang.contrib.nvcc"} <= loaded, sorted(loaded)
    assert got["unguarded"] == [], "compile entry points imported after the guard went up and left unpatched"
