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
