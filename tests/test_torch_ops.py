"""torch_ops: a release's operators as torch custom ops (registration, fake tensors, opcheck,
torch.compile with no graph break or recompile), dispatching exactly like the runtime."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters
from torch._subclasses.fake_tensor import FakeTensorMode

from tileship.declare.spec import Specialization
from tileship.errors import CallError
from tileship.runtime.dispatch import KERNEL, Decision, Entry, OpRunner, OpShape, Release


@pytest.fixture
def release(cpu_release_build):
    import tileship

    return tileship.load(cpu_release_build.path)


@pytest.fixture
def ops(release):
    from tileship.torchops.custom_ops import register

    return register(release)


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6)


def fake_release(reference: Any, kernel: Any = None, release_id: str = "f00d000000000001") -> Release:
    """A Release over an in-process "kernel" (any callable) and reference: the dispatcher's
    real code with no TileLang artifact, for behaviour the catalog kernels cannot show."""
    spec = Specialization("scale", "float32", (("M", (1, 64)), ("N", 8)), "c")
    entries = [Entry(spec, kernel, Decision(KERNEL, KERNEL, spec.id))] if kernel else []
    runner = OpRunner(OpShape("scale", (("X", ("M", "N")),), 1), reference, entries)
    decl = {"inputs": [["X", ["M", "N"]]], "outputs": [["Y", ["M", "N"]]]}
    return Release(release_id=release_id, path=None, kernel_revision="test", model={}, lock={}, lock_digest="",
                   drift=None, ops={"scale": runner}, declarations={"scale": decl})


def test_every_operator_is_a_custom_op_named_by_release(release, ops):
    ns = f"tileship_{release.release_id}"
    assert ops.namespace == ns and set(ops) == {"add", "rmsnorm_cpu"}
    assert getattr(torch.ops, ns).add.default is ops.add
    assert str(ops.rmsnorm_cpu._schema) == f"{ns}::rmsnorm_cpu(Tensor X, Tensor W) -> Tensor"
    x, w = torch.randn(7, 1024), torch.randn(1024)
    torch.testing.assert_close(getattr(torch.ops, ns).rmsnorm_cpu(x, w), rms(x, w))
    assert release.counters()["rmsnorm_cpu"] == {"kernel:kernel": 1}
    with pytest.raises(AttributeError, match=r"has no operator 'gemm' \(it has: add, rmsnorm_cpu\)"):
        ops.gemm  # noqa: B018


def test_dispatch_and_counters_are_the_runtimes(release, ops):
    a, b = torch.randn(4096), torch.randn(4096)
    torch.testing.assert_close(ops.add(a, b), a + b)
    x = torch.randn(3, 100)  # N=100: no specialization
    torch.testing.assert_close(ops.rmsnorm_cpu(x, torch.ones(100)), rms(x, torch.ones(100)))
    assert release.counters() == {"add": {"kernel:kernel": 1}, "rmsnorm_cpu": {"reference:undeclared_shape": 1}}
    runner = release.op("add")
    runner.disable(runner.entries[0], "disabled_by_policy")
    runner.disable(runner.entries[1], "disabled_by_policy")
    runner.forget()
    torch.testing.assert_close(ops.add(a, b), a + b)
    assert release.counters()["add"] == {"kernel:kernel": 1, "reference:disabled_by_policy": 1}
    with pytest.raises(CallError, match=r"add\(B\): dim N=5 disagrees with N=4096"):
        ops.add(a, torch.randn(5))


def test_a_kernel_that_raises_opens_the_circuit_inside_the_op():
    from tileship.torchops.custom_ops import register

    def broken(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("launch failed")

    rel = fake_release(lambda x: x * 2, kernel=broken, release_id="f00d000000000002")
    op = register(rel).scale
    x = torch.randn(4, 8)
    torch.testing.assert_close(op(x), x * 2)
    assert rel.counters()["scale"] == {"reference:circuit_open": 1}
    assert rel.decisions()["scale"] == {"scale.float32.M1-64_N8.c": "reference:circuit_open"}


def test_reregistering_rebinds_and_a_second_release_gets_its_own_namespace(cpu_release_build, cpu_release):
    import tileship
    from tileship.release import bundle
    from tileship.torchops.custom_ops import register, registered

    first = tileship.load(cpu_release_build.path)
    ops = register(first)
    again = tileship.load(cpu_release_build.path)
    assert register(again) is ops  # same id: same ops, now served by the newer load
    assert registered(first.release_id) is ops
    a = torch.randn(10)
    ops.add(a, a)
    assert again.counters()["add"] == {"kernel:kernel": 1} and first.counters()["add"] == {}

    meta = json.loads((cpu_release / "release.json").read_text())
    meta["model"]["version"] = "2"
    (cpu_release / "release.json").write_text(json.dumps(meta))
    bundle.write_manifest(cpu_release)  # another release: same kernels, another id
    other = tileship.load(cpu_release)
    assert other.release_id != first.release_id
    ops2 = register(other)
    assert ops2.namespace == f"tileship_{other.release_id}" != ops.namespace
    ops2.add(a, a)
    ops.add(a, a)
    assert other.counters()["add"] == {"kernel:kernel": 1} and again.counters()["add"] == {"kernel:kernel": 2}


@pytest.mark.parametrize("name,args", [
    ("add", lambda: (torch.randn(1000), torch.randn(1000))),               # dynamic kernel
    ("add", lambda: (torch.randn(4096), torch.randn(4096))),               # static kernel
    ("rmsnorm_cpu", lambda: (torch.randn(5, 1024), torch.randn(1024))),   # dynamic kernel
    ("rmsnorm_cpu", lambda: (torch.randn(64, 256), torch.randn(256))),    # static kernel
    ("rmsnorm_cpu", lambda: (torch.randn(3, 100), torch.randn(100))),     # reference
], ids=["add-dynamic", "add-static", "rmsnorm-dynamic", "rmsnorm-static", "rmsnorm-reference"])
def test_opcheck(ops, name, args):
    torch.library.opcheck(ops[name], args())


def test_opcheck_with_a_reference_returning_another_layout():
    from tileship.torchops.custom_ops import register

    rel = fake_release(lambda x: (x * 2).t().contiguous().t(), release_id="f00d000000000003")  # column-major output
    op = register(rel).scale
    x = torch.randn(6, 8)
    out = op(x)
    assert out.is_contiguous()  # the layout the fake promised, so compiled code indexes it right
    torch.testing.assert_close(out, x * 2)
    torch.library.opcheck(op, (x,))


def test_fake_tensors_follow_the_declaration(ops):
    with FakeTensorMode():
        y = ops.rmsnorm_cpu(torch.empty(9, 1024, dtype=torch.float16), torch.empty(1024, dtype=torch.float16))
        assert y.shape == (9, 1024) and y.dtype == torch.float16
        assert ops.add(torch.empty(123), torch.empty(123)).shape == (123,)
        with pytest.raises(CallError,
                           match=r"rmsnorm_cpu\(X\): has rank 3 \(shape \(9, 1024, 1\)\), declared \(M, N\)"):
            ops.rmsnorm_cpu(torch.empty(9, 1024, 1), torch.empty(1024))
        with pytest.raises(CallError, match=r"rmsnorm_cpu\(W\): dim N=1000 disagrees with N=1024"):
            ops.rmsnorm_cpu(torch.empty(9, 1024), torch.empty(1000))
    with torch.device("meta"):
        assert ops.add(torch.empty(7), torch.empty(7)).device.type == "meta"


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_one_graph_across_declared_sizes(release, ops, backend):
    from tileship.torchops.custom_ops import mark_dynamic

    def block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = ops.rmsnorm_cpu(x, w)
        return ops.add(y.reshape(-1), x.reshape(-1)).view(x.shape) * 0.5

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    w = torch.randn(1024)
    sizes = (1, 3, 4096) if backend == "inductor" else (1, 3, 64, 4096, 4097)  # 4097: past the declared range
    for m in sizes:
        x = mark_dynamic(torch.randn(m, 1024), 0)
        torch.testing.assert_close(compiled(x, w), (rms(x, w) + x) * 0.5)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"]
    want = {"kernel:kernel": 4, "reference:undeclared_shape": 1} if backend == "aot_eager" else {"kernel:kernel": 3}
    assert release.counters()["rmsnorm_cpu"] == want


def test_explain_reports_no_graph_break(ops):
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ops.add(a, b).relu()

    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(torch.randn(16), torch.randn(16))
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert any(ops.namespace in str(n.target) for g in explained.graphs for n in g.graph.nodes)


def test_namespace_needs_an_identifier_id():
    from tileship.torchops.custom_ops import namespace_of

    assert namespace_of("0123abcd") == "tileship_0123abcd"
    with pytest.raises(ValueError, match="cannot name a torch.library namespace"):
        namespace_of("12-34")


def test_docs_example_runs(cpu_release_build, capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "pytorch.md").read_text()
    block = re.search(r"## Custom ops\n\n```python\n(.*?)```", text, re.S).group(1)
    printed = re.search(r"^print\(.*\)\n# (.*)$", block, re.M).group(1)
    torch._dynamo.reset()
    exec(compile(block, "docs/pytorch.md", "exec"), {"release_path": cpu_release_build.path})
    assert capsys.readouterr().out.strip() == printed
