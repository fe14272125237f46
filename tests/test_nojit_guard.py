"""The no-JIT guard covers every compile entry point of the installed TileLang (enumerated from its sources)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tileship.errors import CompileForbidden
from tileship.runtime import nojit

#: found by the enumeration, reviewed: not a way to compile a kernel
REVIEWED = {
    "tilelang.instrumentation.session.compile_pass_instrumentation",  # builds a pass-instrumentation list
    "tilelang.tools.lower_trace.lower_trace",  # a debug trace around lower (which is guarded)
}
METHODS = ("compile_lib", "compile", "_compile_and_create_adapter", "cached")


def compile_entry_points() -> set[str]:
    """Every module-level ``compile*``/``lower*`` function and compile method in TileLang's own sources."""
    import tilelang

    root = Path(tilelang.__file__).parent
    found = set()
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if rel.parts[0] in ("3rdparty", "tvm", "lib"):
            continue
        mod = ".".join(("tilelang", *rel.with_suffix("").parts)).removesuffix(".__init__")
        try:
            tree = ast.parse(p.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        for n in tree.body:
            if isinstance(n, ast.FunctionDef) and n.name.startswith(("compile", "lower")):
                found.add(f"{mod}.{n.name}")
            if isinstance(n, ast.ClassDef):
                found |= {f"{mod}.{n.name}.{m.name}" for m in n.body
                          if isinstance(m, ast.FunctionDef) and m.name in METHODS}
    return found


def test_every_compile_entry_point_is_guarded_or_reviewed() -> None:
    guarded = {f"{m}.{a}" for m, a in nojit.GUARDED}
    new = compile_entry_points() - guarded - REVIEWED
    assert not new, f"TileLang has compile entry points the no-JIT guard does not cover: {sorted(new)}; " \
                    "add them to nojit.GUARDED (or to REVIEWED here with why)"
    assert guarded - compile_entry_points() == set(), "GUARDED names something TileLang no longer has"


#: names a caller may reach a compile function by, besides ``GUARDED`` itself
ALIASES = ["tilelang.lower", "tilelang.compile", "tilelang.contrib.compile_cuda", "tilelang.contrib.nvcc.compile_cuda",
           "tilelang.contrib.nvrtc.compile_cuda", "tilelang.jit.compile"]


@pytest.mark.parametrize("order", ["before", "after"])
def test_every_entry_point_raises_whether_tilelang_was_imported_before_the_guard_or_after(order: str) -> None:
    """In a fresh interpreter: ``install()`` imports nothing; every ``GUARDED`` entry point (NVRTC and
    CuTeDSL included) and every alias raises CompileForbidden and is counted, the compile modules
    imported before the guard went up as much as those imported after it."""
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent / "src"), str(tests)])}
    r = subprocess.run([sys.executable, str(tests / "nojit_child.py"), order, *ALIASES], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["unavailable"] == {}, f"guarded modules that could not be imported, so were not checked: {got}"
    assert got["not_raising"] == [], f"compile entry points that did not raise under the guard: {got['not_raising']}"
    assert got["attempts"] == len(nojit.GUARDED) + len(ALIASES)


@pytest.mark.parametrize("call", [
    "tilelang.lower", "tilelang.compile", "tilelang.engine.lower.lower_with_context", "tilelang.contrib.compile_cuda",
    "tilelang.contrib.nvcc.compile_cuda", "tilelang.jit.adapter.cutedsl.libgen.CuTeDSLLibraryGenerator.compile_lib",
])
def test_guarded_calls_raise(call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    nojit.install()
    monkeypatch.setattr(nojit, "_attempts", nojit.attempts())  # the counter is process-wide: restore it after
    parts = call.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
            break
        except ImportError:
            continue
    for attr in parts[i:]:
        obj = getattr(obj, attr)
    before = nojit.attempts()
    with pytest.raises(CompileForbidden):
        obj(None)
    assert nojit.attempts() == before + 1
