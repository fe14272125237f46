"""Shared fixtures. CPU tests build real TileLang "c"-target kernels once per session."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TILELANG_CACHE_DIR", tempfile.mkdtemp(prefix="tileship-test-tlcache-"))
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU test host)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cpu_project():
    from tileship.declare.project import builtin_project

    return dataclasses.replace(builtin_project(), targets=("c",), operator_modules=("tileship.catalog.cpu",))


@pytest.fixture(scope="session")
def cpu_release_build(tmp_path_factory: pytest.TempPathFactory, cpu_project):
    """A BuildResult of the built-in CPU catalog, built once per session (read-only: copy before editing)."""
    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import load_operators

    out = tmp_path_factory.mktemp("releases")
    return build(cpu_project, load_operators(cpu_project), out, BuildOptions(jobs=2))


@pytest.fixture(scope="session")
def calls_release_build(tmp_path_factory: pytest.TempPathFactory):
    """A BuildResult of ``tests/calls_ops.py`` (small foreign "c"-target operators), built once per session; each
    test module loads its own release from it (read-only: copy before editing)."""
    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import Project, load_operators

    proj = Project(model="calls", model_version="1", operator_modules=("calls_ops",), targets=("c",), root=TESTS)
    res = build(proj, load_operators(proj), tmp_path_factory.mktemp("calls"), BuildOptions(jobs=2))
    assert res.ok, [(r.spec.id, r.error) for r in res.failed]
    return res


@pytest.fixture
def cpu_release(cpu_release_build, tmp_path: Path) -> Path:
    """A private copy of the CPU release that a test may tamper with."""
    dest = tmp_path / cpu_release_build.release_id
    shutil.copytree(cpu_release_build.path, dest)
    return dest


@pytest.fixture(scope="module")
def grpc_server(cpu_release_build, tmp_path_factory: pytest.TempPathFactory):
    """A server of the CPU release on 127.0.0.1, REST and gRPC, ready; one per test module."""
    import io

    from test_serve import serving

    from tileship.serve import ServeConfig

    cfg = ServeConfig(source=cpu_release_build.path, grpc_port=0, diagnostics_dir=tmp_path_factory.mktemp("diag"),
                      log_stream=io.StringIO())
    with serving(cfg) as srv:
        yield srv


# Leaving the test process. A fresh-clone CI run at 21ce770 passed every test (1401 passed, 6 skipped)
# and then died with SIGSEGV in interpreter finalization, after pytest had printed its summary: a
# native library's teardown racing a daemon thread that a test left behind (pools' monitors,
# Ray's and gRPC's own threads). Two later runs of the same tree exited cleanly. The verdict is
# pytest's exit status, so once pytest is done with everything (reports, cache) the process leaves
# with that status and skips finalization. The threads still alive are listed first, to hunt the
# race down; TILESHIP_TEST_FINALIZE=1 keeps the normal exit (to reproduce the crash).
_EXIT: dict[str, int] = {}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT["status"] = int(exitstatus)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    import threading

    alive = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    if alive:
        terminalreporter.write_line(f"threads alive at the end of the session ({len(alive)}): "
                                    f"{', '.join(alive[:40])}")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    import sys

    if "status" not in _EXIT or os.environ.get("TILESHIP_TEST_FINALIZE") == "1":
        return
    if hasattr(config, "workerinput"):  # never in a pytest-xdist worker: its controller waits for it
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT["status"])
