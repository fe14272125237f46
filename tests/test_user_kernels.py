"""A user's own CPU kernels (``tests/user_ops.py``) through build -> load -> call -> verify: shapes of kernels
the catalog does not have, each checked on the real "c"-target build."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("tilelang")

import user_ops  # noqa: E402

from tileship.build.builder import BuildOptions, build  # noqa: E402
from tileship.declare.project import Project, load_operators  # noqa: E402

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def user_build(tmp_path_factory):
    proj = Project(model="user", model_version="1", operator_modules=("user_ops",), targets=("c",), root=TESTS)
    res = build(proj, load_operators(proj), tmp_path_factory.mktemp("user"), BuildOptions(jobs=2))
    assert [(r.spec.id, r.error) for r in res.failed] == [
        ("interleave.float32.rows4_n_cols6.c", "ValueError: a static n_cols must be a multiple of 4, got 6")]
    return res


def test_an_output_sized_by_an_expression_of_a_dynamic_dim_is_allocated_called_and_verified(user_build):
    """``y: T.Tensor((rows, n_cols * 2))`` under ``T.dynamic`` n_cols: the kernel's own output shape is a TIR
    expression. The loaded kernel allocated it by looking the expression up as a symbol (``TypeError: unhashable
    type: 'dict'``): every call with the scalar argument (the path through the kernel object) failed, and verify
    failed the kernel at every point, so the reference served a correct kernel."""
    from tileship.runtime.loader import load
    from tileship.verify.spec_check import VerifyOptions
    from tileship.verify.verify import verify

    rel = load(user_build.path)
    for n in (1, 7, 8, 512):
        x = torch.randn(4, n)
        y, d = rel.op("interleave").call(x, 0.5)
        assert (d.path, d.reason) == ("kernel", "kernel") and torch.equal(y, user_ops.interleave_ref(x, 0.5)), (n, d)
    report = verify(user_build.path, VerifyOptions(timing=False), write=False)
    assert [v.failure for v in report.verdicts] == [None], [v.failure for v in report.verdicts]


def test_a_static_shape_that_failed_to_build_is_served_by_the_range_that_covers_it(user_build):
    """``shapes=({"rows": 4, "n_cols": 6},)`` failed to build, the range n_cols 1..512 built: a call at n_cols=6
    was answered by the reference (``build_failed``) while 5 and 7 ran the range's kernel."""
    from tileship.runtime.loader import load

    rel = load(user_build.path)
    for n in (5, 6, 7):
        x = torch.randn(4, n)
        y, d = rel.op("interleave").call(x, 2.0)
        assert (d.path, d.reason, d.spec_id) == ("kernel", "kernel", "interleave.float32.rows4_n_cols1-512.c"), (n, d)
        assert torch.equal(y, user_ops.interleave_ref(x, 2.0))
        assert torch.equal(rel.op("interleave")(x, 2.0), y)  # the compiled table's row agrees
