"""`pip install .` ships the product only: the built wheel holds the public API and the pipeline
stages, and no test fixture, fault-injection kernel, load generator or example model."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import tileship

ROOT = Path(__file__).resolve().parent.parent
#: never copied into the build tree: at the root, environments, caches, build outputs; anywhere, bytecode and egg-info
ROOT_SKIP = {".venv", ".git", ".gpu", ".kdev", "build", "dist", ".pytest_cache", ".ruff_cache", ".mypy_cache",
             ".tileship", "out", ".rel"}
#: a definition that only a fixture, the load generator or the example holds, wherever its file ends up
FIXTURE_CODE = ("def oob_copy(", "def run_client(", "def random_llama(", "class LlamaHost", "def wrong_kernel(")


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """name -> content of every file of the wheel built from a clean copy of the repository
    (a copy, so stale files of an earlier in-tree build cannot leak in and nothing is written here)."""
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"
    shutil.copytree(ROOT, tree, ignore=_skip)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp / "dist")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp / "dist").glob("tileship-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _skip(directory: str, names: list[str]) -> set[str]:
    skipped = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
    return skipped | (ROOT_SKIP & set(names) if Path(directory) == ROOT else set())


def test_wheel_holds_the_public_api_and_every_stage(wheel_files: dict[str, bytes]) -> None:
    names = set(wheel_files)
    for module in ("__init__", "errors", "env", "declare/spec", "declare/project", "build/lock", "build/builder",
                   "build/worker", "release/bundle", "release/registry", "runtime/loader", "runtime/dispatch",
                   "runtime/nojit", "verify/verify", "verify/drill", "serve/app", "serve/routes", "torchops/swap",
                   "torchops/layers", "cli/__init__", "extras", "catalog/gemm", "catalog/cpu"):
        assert f"tileship/{module}.py" in names, f"tileship/{module}.py is missing from the wheel"
    for name in tileship.__all__:  # every public name is defined in a module the wheel ships
        obj = getattr(tileship, name)
        module = getattr(obj, "__module__", None)
        if module is not None and module.startswith("tileship"):
            assert module.replace(".", "/") + ".py" in names or module.replace(".", "/") + "/__init__.py" in names, (
                name,
                module,
            )
    assert any(n.endswith(".dist-info/entry_points.txt") and b"tileship.cli:main" in c for n, c in wheel_files.items())


def test_wheel_ships_no_fixture_load_generator_or_example(wheel_files: dict[str, bytes]) -> None:
    names = sorted(wheel_files)
    top = {n.split("/", 1)[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"tileship"}, (
        f"top-level entries besides tileship: {sorted(top)}"
    )
    for gone in ("tileship/catalog/faults.py", "tileship/verify/drill_client.py", "tileship/serve/model.py"):
        assert gone not in names
    assert not [n for n in names if n.startswith(("tileship/models/", "tileship/examples/", "tileship/tests/",
                                                  "tileship/benchmarks/"))]
    assert not [n for n in names if "/tests/" in n or n.rsplit("/", 1)[-1].startswith(("test_", "conftest"))]
    for name, content in wheel_files.items():
        if name.endswith(".py"):
            text = content.decode()
            found = [c for c in FIXTURE_CODE if c in text]
            assert not found, f"{name} defines {found}: a fixture, the load generator or the example ships in the wheel"


# -- what the wheel leaves out is found in a checkout, and named when it is not -----------------------

NO_CHECKOUT = "import tileship.extras as e; e.CHECKOUT = None\n"


def _python(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter away from the repository: tileship from src/ only, no
    examples/ or benchmarks/ on sys.path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT / "src")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=env)


@pytest.mark.parametrize("name", ["llama_example", "drill_client"])
def test_a_checkout_provides_what_the_wheel_leaves_out(name: str, tmp_path: Path) -> None:
    proc = _python(f"import tileship.extras as e; print(e.{name}().__file__)", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).is_relative_to(ROOT / ("examples" if name == "llama_example" else "benchmarks"))


def test_serve_llama_without_the_example_names_the_flag_and_the_file(tmp_path: Path) -> None:
    proc = _python(NO_CHECKOUT + "import sys; sys.argv[0] = 'tileship'; from tileship.cli import main; main()",
                   "serve", str(tmp_path), "--llama", "tiny", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert "--llama needs examples.llama.serve (examples/llama/serve.py in the tileship repository)" in err, err
    assert "PYTHONPATH" in err and "Traceback" not in proc.stderr


def test_drill_without_the_load_generator_names_the_file(tmp_path: Path) -> None:
    proc = _python(NO_CHECKOUT + "import sys; sys.argv[0] = 'tileship'; from tileship.cli import main; main()",
                   "drill", "--registry", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert (
        "tileship drill needs benchmarks.drill_client (benchmarks/drill_client.py in the tileship repository)" in err
    ), err
    assert "Traceback" not in proc.stderr


def test_the_plain_install_brings_no_web_server_test_tools_or_compiler(wheel_files: dict[str, bytes]) -> None:
    """``pip install tileship`` (no extras): the runtime only; the server is ``tileship[serve]``."""
    meta = next(v for k, v in wheel_files.items() if k.endswith(".dist-info/METADATA")).decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    plain = {_name(r) for r in requires if "extra ==" not in r}
    serve = {_name(r) for r in requires if 'extra == "serve"' in r}
    assert "tilelang" in plain and "torch" in plain
    for name in ("starlette", "uvicorn", "httptools", "fastapi", "pydantic", "pytest", "hypothesis", "tritonclient",
                 "nvidia-cuda-nvcc", "ray"):
        assert name not in plain, f"{name} is installed by a plain `pip install tileship`"
    assert {"starlette", "uvicorn", "orjson", "prometheus-client"} <= serve, serve
    assert "tileship/py.typed" in wheel_files
    pinned = [r for r in requires if "==" in r.split(";")[0] and 'extra == "test"' not in r]
    assert not pinned, (
        f"the runtime or an extra a model server installs pins with == (ranges; constraints.txt pins): {pinned}"
    )


def _name(requirement: str) -> str:
    """The distribution a Requires-Dist line names (``ray[serve]>=2.60,<3; extra == "ray"`` -> ``ray``)."""
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower()
