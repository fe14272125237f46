"""docs/declaring.md is runnable: every declaration in it builds for the CPU target, loads with no
JIT, passes verification (poisoned outputs, per-output dtypes and tolerances) and runs."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tileship.build.builder import BuildOptions, build
from tileship.declare.project import Project, load_operators

ROOT = Path(__file__).parent.parent
GUIDE = ROOT / "docs" / "declaring.md"
EXPECTED = ["add", "add_some", "add_tuned", "gemv", "kv_append", "layer_norm", "masked_decode", "row_sum"]


def guide_module() -> str:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    head = ("from guide_kernels import *  # noqa: F403\n"
            "from tileship import DynamicRange, Operator, Space, TensorArg, Tolerance\n\n")
    return head + "\n".join(blocks)


@pytest.fixture(scope="module")
def guide_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("guide")
    (root / "guide_ops.py").write_text(guide_module())
    # A name of its own: tests/user_ops.py imports tests/declaring_kernels.py as ``declaring_kernels``, and a
    # module already imported from outside the project root is (rightly) not shipped, so the build would fail
    # whenever a test importing user_ops ran first in the same process.
    shutil.copy(Path(__file__).parent / "declaring_kernels.py", root / "guide_kernels.py")
    proj = Project(model="guide", model_version="1", operator_modules=("guide_ops",), targets=("c",), root=root)
    ops = load_operators(proj)
    assert sorted(ops) == EXPECTED
    return build(proj, ops, root / "releases", BuildOptions(jobs=2))


def test_the_guide_has_eight_declarations():
    assert len(re.findall(r"```python\n", GUIDE.read_text())) == 8


def test_every_guide_declaration_builds_verifies_and_runs(guide_build):
    from tileship.runtime.loader import load
    from tileship.verify.demo import exercise
    from tileship.verify.spec_check import VerifyOptions
    from tileship.verify.verify import verify

    assert guide_build.ok, [(r.spec.id, r.error) for r in guide_build.failed]
    res = verify(guide_build.path, VerifyOptions(timing=False, seeds=(0, 1), limit=512), write=False)
    assert res.ok, [(v.spec.id, v.failure) for v in res.verdicts]
    assert sorted({v.spec.op for v in res.verdicts}) == EXPECTED
    rows = exercise(load(guide_build.path), limit=512)
    assert rows and all(r["path"] == "kernel" and r["ok"] for r in rows), [r for r in rows if not r["ok"]]
