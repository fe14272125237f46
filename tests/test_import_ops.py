"""Operator modules that misbehave at import (probe ``foreign_kernels_round16``): one that compiles a kernel
(F8) and one that reads a data file next to it (F9). The build imports the release's source snapshot as a
serving host will, and fails naming the module and why; a load says the same, not "add its shape"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tilelang")

from tests import import_ops  # noqa: E402

from tileship.build.builder import BuildOptions, build  # noqa: E402
from tileship.declare.project import Project, load_operators  # noqa: E402
from tileship.errors import BuildError  # noqa: E402

ON_IMPORT = "compiled a TileLang kernel at import time; operator modules must not compile on import"


def _project(tmp_path: Path, module: str, text: str, **files: str) -> Project:
    root = tmp_path / "proj"
    root.mkdir()
    (root / f"{module}.py").write_text(text)
    for name, body in files.items():
        (root / name.replace("_", ".")).write_text(body)
    return Project(model="m", model_version="1", operator_modules=(module,), targets=("c",), root=root)


_BUILD = """
import json, sys
from pathlib import Path
from tileship.build.builder import BuildOptions, build, compile_one
from tileship.declare.project import Project, load_operators
from tileship.declare.spec import expand
from tileship.errors import BuildError
root, out = Path(sys.argv[1]), Path(sys.argv[2])
project = Project(model="m", model_version="1", operator_modules=("compiles_on_import_ops",), targets=("c",), root=root)
ops = load_operators(project)
(spec,) = expand(ops["double"])
r = compile_one(ops["double"], spec, out / "one", timeout_s=300, sys_path=str(root))
try:
    build(project, ops, out / "rel", BuildOptions(jobs=1))
    built = None
except BuildError as exc:
    built = str(exc)
print(json.dumps([r.ok, r.error, built]))
"""


def test_a_module_compiling_at_import_fails_the_build_naming_it(tmp_path: Path) -> None:
    # in a child: this process may hold the no-JIT guard of a release loaded by another test
    project = _project(tmp_path, "compiles_on_import_ops", import_ops.COMPILE)
    proc = subprocess.run([sys.executable, "-c", _BUILD, str(project.root), str(tmp_path)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok, error, text = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not ok and f"compiles_on_import_ops (or a module it imports) {ON_IMPORT}" in error, error
    assert "cache entry" not in error
    assert "compiles_on_import_ops compiled a TileLang kernel at import time (tilelang.jit.compile); operator " \
        "modules must not compile on import" in text and "add its shape" not in text, text
    assert not [p for p in (tmp_path / "rel").iterdir() if not p.name.startswith(".")]  # no release written


def test_a_load_names_the_module_that_compiles_on_import_not_a_missing_shape(tmp_path: Path) -> None:
    project = _project(tmp_path, "compiles_on_load_ops", import_ops.COMPILE)
    code = ("import json, sys; from tileship.runtime import nojit; nojit.install()\n"
            "from tileship.runtime.references import import_callable\n"
            "from tileship.errors import ArtifactLoadError\n"
            "try:\n    import_callable('compiles_on_load_ops.ref', 'double', 'reference')\n"
            "except ArtifactLoadError as exc:\n    print(json.dumps([exc.message, exc.hint]))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=project.root, capture_output=True, text=True, timeout=300)
    message, hint = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "double: cannot import the reference compiles_on_load_ops.ref: compiles_on_load_ops compiled a TileLang " \
        "kernel at import time (tilelang.jit.compile); operator modules must not compile on import" in message
    assert "add its shape" not in hint and "compile only in the kernel factory" in hint, hint


def test_a_module_reading_a_data_file_fails_the_build_naming_the_file(tmp_path: Path) -> None:
    project = _project(tmp_path, "reads_data_ops", import_ops.DATA, scale_json='{"scale": 3.0}')
    ops = load_operators(project)  # imports fine from the project, where scale.json is
    with pytest.raises(BuildError) as info:
        build(project, ops, tmp_path / "rel", BuildOptions(jobs=1))
    text = str(info.value)
    assert "the release would not load: scaled: cannot import the reference reads_data_ops.ref: FileNotFoundError" \
        in text and "sources/scale.json" in text, text
    assert "only the operator modules' .py files ship" in text


def test_a_process_under_the_no_jit_guard_says_the_module_compiles_on_import(tmp_path: Path) -> None:
    project = _project(tmp_path, "compiles_under_guard_ops", import_ops.COMPILE)
    code = ("import sys; from pathlib import Path; from tileship.runtime import nojit; nojit.install()\n"
            "from tileship.declare.project import Project, load_operators\n"
            "p = Project(model='m', model_version='1', operator_modules=('compiles_under_guard_ops',), "
            "targets=('c',), root=Path(sys.argv[1]))\nload_operators(p)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(project.root)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    last = proc.stderr[proc.stderr.rindex("tileship.errors.DeclarationError"):]  # not the chained CompileForbidden
    assert "cannot import compiles_under_guard_ops: compiles_under_guard_ops compiled a TileLang kernel at import " \
        "time" in last and "add its shape" not in last, last
