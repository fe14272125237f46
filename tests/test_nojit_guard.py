"""The no-JIT guard covers every compile entry point of the installed TileLang (enumerated from its sources)."""

from __future__ import annotations

import ast
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
