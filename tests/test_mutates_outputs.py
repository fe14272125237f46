"""An operator that returns an output and updates an input in place (``tests/inplace_ops.py``): real
"c"-target builds (one ``T.dynamic`` M) through dispatch, ``out=``, verify and the torch custom op."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tileship
from tileship.build.builder import BuildOptions, build
from tileship.declare.project import Project, load_operators

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def inplace_release(tmp_path_factory):
    proj = Project(model="inplace", model_version="1", operator_modules=("inplace_ops",), targets=("c",), root=TESTS)
    res = build(proj, load_operators(proj), tmp_path_factory.mktemp("inplace"), BuildOptions(jobs=2))
    assert res.ok, [(r.spec.id, r.error) for r in res.failed]
    return res.path


@pytest.mark.parametrize("m, n", [(4, 32), (1, 64), (37, 64)], ids=["static", "dyn-1", "dyn-37"])
def test_the_output_is_returned_and_the_input_updated_on_the_kernel_path(inplace_release, m, n) -> None:
    release = tileship.load(inplace_release)
    runner = release.op("residual_add")
    x, r = torch.randn(m, n), torch.randn(m, n)
    want_r = r + x
    s, decision = runner.call(x, r)
    assert (decision.path, decision.reason) == ("kernel", "kernel"), decision
    assert torch.allclose(r, want_r) and torch.allclose(s, want_r.sum(dim=1), atol=1e-4)
    out = torch.empty(m)
    assert runner(x, r, out=out) is out and torch.allclose(r, want_r + x)  # out= too: S there, R updated again
    assert torch.allclose(out, (want_r + x).sum(dim=1), atol=1e-4)
    assert "ctypes" in runner.launchers().values()


def test_verify_compares_the_output_and_the_updated_input(inplace_release) -> None:
    from tileship.verify.spec_check import VerifyOptions, verify_spec
    from tileship.verify.verify import verify

    res = verify(inplace_release, VerifyOptions(seeds=(0,), timing=False, grid=0), write=False)
    assert res.verdicts and all(v.passed for v in res.verdicts), [v.failure for v in res.verdicts]
    assert all(len(p.checks) == 2 for v in res.verdicts for p in v.points)  # S, then the whole R

    def sums_only(x, r):  # the right output, but R left as it was
        return (r + x).sum(dim=1)

    v = res.verdicts[-1]
    desc = json.loads((inplace_release / "release.json").read_text())["operators"]["residual_add"]
    import inplace_ops

    bad = verify_spec(v.spec, sums_only, inplace_ops.residual_add_reference, desc,
                      options=VerifyOptions(seeds=(0,), timing=False, grid=0, strict_poison=False))
    assert not bad.passed and "output R:" in bad.failure, bad.failure


def test_the_custom_op_returns_the_output_and_mutates_under_compile(inplace_release) -> None:
    from tileship.torchops.custom_ops import register

    release = tileship.load(inplace_release)
    op = register(release).residual_add
    assert "Tensor(a!) R" in str(op._schema) and str(op._schema).endswith("-> Tensor")

    def layer(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return op(x, r) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x, r = torch.randn(4, 32), torch.randn(4, 32)
    want_r = r + x
    got = compiled(x, r)
    assert torch.allclose(r, want_r), "the compiled graph did not update R"
    assert torch.allclose(got, want_r.sum(dim=1) * 2.0, atol=1e-4)
    assert release.counters()["residual_add"] == {"kernel:kernel": 1}


def test_check_finite_reruns_the_reference_on_the_inputs_as_they_were(inplace_release) -> None:
    """R += X is not idempotent: the reference that checks a non-finite output must not add X twice."""
    runner = tileship.load(inplace_release).op("residual_add")
    runner.check_finite = True
    x, r = torch.randn(4, 32), torch.randn(4, 32)
    r[0, 0] = float("inf")  # the caller's residual may hold anything; the row sum is then inf on both paths
    want_r = r + x
    s, decision = runner.call(x, r)
    assert decision.path == "kernel" and runner.faults == {}  # inf in, inf out: nothing to blame the kernel for
    assert torch.isinf(s[0]) and torch.isfinite(s[1:]).all()
    assert torch.equal(r, want_r), "X was added twice"
    entry = next(e for e in runner.entries if e.kernel is not None and e.spec.dims == (("M", 4), ("N", 32)))

    def nan_sums(x, r):  # updates R right, but returns NaN sums: the reference's answer replaces them
        r.add_(x)
        return torch.full((x.shape[0],), float("nan"))

    entry.kernel = nan_sums
    r = torch.randn(4, 32)
    want_r = r + x
    s, decision = runner.call(x, r)
    assert (decision.path, decision.reason) == ("reference", "circuit_open") and runner.faults == {"non_finite": 1}
    assert torch.allclose(s, want_r.sum(dim=1)) and torch.equal(r, want_r), "X was added twice"
