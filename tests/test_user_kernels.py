"""A user's own CPU kernels (``tests/user_ops.py``) through build -> load -> call -> verify: shapes of kernels
the catalog does not have, each checked on the real "c"-target build."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("tilelang")

import user_ops  # noqa: E402

from tileship.build.builder import BuildOptions, build  # noqa: E402
from tileship.declare.project import Project, load_operators  # noqa: E402
from tileship.errors import DeclarationError  # noqa: E402

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def user_build(tmp_path_factory):
    proj = Project(model="user", model_version="1", operator_modules=("user_ops",), targets=("c",), root=TESTS)
    res = build(proj, load_operators(proj), tmp_path_factory.mktemp("user"), BuildOptions(jobs=2))
    assert sorted((r.spec.id, r.error) for r in res.failed if r.spec.op not in C_LIMITS) == [
        ("interleave.float32.rows4_n_cols6.c", "ValueError: a static n_cols must be a multiple of 4, got 6"),
        ("numpy_answer.float32.N8.c", "NotImplementedError: no kernel yet"),
        ("wrong_dtype.float32.N8.c", "NotImplementedError: no kernel yet"),
        ("wrong_shape.float32.N8.c", "NotImplementedError: no kernel yet")]
    return res


#: operator -> (the specialization that cannot be built for "c", the words of its failure), ``tests/user_ops.py``
C_LIMITS = {
    "twice_bf16": ("twice_bf16.bfloat16.N8.c", "twice_bf16.bfloat16.N8.c: the kernel's parameter 'A' is bfloat16, "
                                               'which the CPU "c" target cannot compile'),
    "is_positive": ("is_positive.float32.N8.c", "is_positive.float32.N8.c: the kernel's parameter 'P' is a bool "
                                                'tensor, which the CPU "c" target cannot pass'),
    "keywords": ("keywords.float32.N8.c", "keywords.float32.N8.c: the kernel's parameter 'int' is named with a "
                                          "C/C++ reserved word"),
}


def test_what_the_c_target_cannot_compile_fails_alone_naming_the_reason_and_the_reference_serves_it(user_build):
    """bfloat16, a bool output and a parameter named ``int`` failed at their compile with the compiler's words
    (``InternalError: Cannot convert type bfloat16 to C type``, ``cannot convert 'bool*' to 'int8_t*'``, ``expected
    ',' or '...' before 'int'``), which name neither the parameter nor the target's limit. Each is now refused before
    the compiler runs, naming the specialization, the parameter and the reason; float32 of the same operator builds,
    and the reference serves the refused specialization's calls."""
    from tileship.runtime.loader import load

    failed = {r.spec.id: r.error for r in user_build.failed if r.spec.op in C_LIMITS}
    assert sorted(failed) == sorted(sid for sid, _ in C_LIMITS.values()), failed
    for sid, words in C_LIMITS.values():
        assert "BuildError" in failed[sid] and words in failed[sid], failed[sid]
    rel = load(user_build.path)
    a = torch.randn(8)
    for name, x, want in (("twice_bf16", a, ("kernel", "kernel")), ("twice_bf16", a.bfloat16(),
                          ("reference", "build_failed")), ("is_positive", a, ("reference", "build_failed")),
                          ("keywords", a, ("reference", "build_failed"))):
        y, d = rel.op(name).call(x)
        assert (d.path, d.reason) == want, (name, x.dtype, d)
        assert torch.equal(y, x > 0 if name == "is_positive" else x + x), name


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
    verdicts = {v.spec.id: v.failure for v in report.verdicts}  # the other kernel built: twice_bf16's float32
    assert verdicts == {"interleave.float32.rows4_n_cols1-512.c": None, "twice_bf16.float32.N8.c": None}, verdicts


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


def test_a_reference_answering_no_tensor_is_a_500_naming_it_and_the_worker_lives_on(user_build, tmp_path):
    """``serve --workers 1``: a reference that returns a NumPy array killed the worker copying it out (and then
    the standby, on the retry): 503 ``worker failure``, then ``no worker is ready``. A worker's 500 also carried
    its Python traceback to the client (in the error's hint)."""
    import httpx
    from test_serve_workers import workers_server

    body = {"inputs": [{"name": "a", "datatype": "FP32", "shape": [8], "data": list(range(8))}]}
    with workers_server(user_build.path, workers=1, diagnostics_dir=tmp_path / "diag") as srv:
        pid = httpx.get(srv.url + "/v2/health/ready", timeout=10).json()["workers"]["serving"]
        for _ in range(2):
            r = httpx.post(srv.url + "/v2/models/numpy_answer/infer", json=body, timeout=30.0)
            assert r.status_code == 500, r.text
            assert "numpy_answer.reference: the call answered ndarray; the operator declares 1 output" in r.text
            assert "Traceback" not in r.text and "worker.py" not in r.text, r.text
        x = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4, 3], "data": list(range(12))},
                        {"name": "s", "datatype": "FP32", "shape": [1], "data": [2.0]}]}
        r = httpx.post(srv.url + "/v2/models/interleave/infer", json=x, timeout=30.0)
        assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [4, 6], r.text
        assert httpx.get(srv.url + "/v2/health/ready", timeout=10).json()["workers"]["serving"] == pid


@pytest.mark.parametrize("workers", [0, 1])
def test_a_reference_answering_another_dtype_or_shape_than_declared_is_a_500_naming_it(user_build, workers):
    """A reference that answers float64 where float32 is declared, or one element short: the server sent it
    as it came, a response unlike the model's own metadata (FP64, or shape [7] where [8] is declared). It is a
    500 naming the output, what it is and what is declared, in process and from a worker alike; the server
    goes on serving."""
    import httpx
    from test_serve_workers import workers_server

    from tileship.serve import BackgroundServer, ServeConfig

    body = {"inputs": [{"name": "a", "datatype": "FP32", "shape": [8], "data": list(range(8))}]}
    in_process = BackgroundServer(ServeConfig(source=user_build.path))
    ctx = workers_server(user_build.path, workers=1) if workers else in_process
    with ctx as srv:
        deadline = time.monotonic() + 60  # in process the release loads after the socket listens
        while httpx.get(srv.url + "/v2/health/ready", timeout=10).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        meta = httpx.get(srv.url + "/v2/models/wrong_dtype", timeout=10).json()
        assert (meta["outputs"][0]["datatype"], meta["outputs"][0]["shape"]) == ("FP32", [8]), meta
        for model, got in (("wrong_dtype", "float64 [8]"), ("wrong_shape", "float32 [7]")):
            r = httpx.post(srv.url + f"/v2/models/{model}/infer", json=body, timeout=30.0)
            assert r.status_code == 500, r.text
            assert f"output 'b' of the call is {got}; the operator declares it float32 [8]" in r.text, r.text
            assert "Traceback" not in r.text
        x = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4, 3], "data": list(range(12))},
                        {"name": "s", "datatype": "FP32", "shape": [1], "data": [2.0]}]}
        r = httpx.post(srv.url + "/v2/models/interleave/infer", json=x, timeout=30.0)
        assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [4, 6], r.text


def test_a_reference_answering_another_dtype_shape_or_type_is_refused_in_process(user_build):
    """``release.op(name)(...)``, ``.call`` and the torch custom op returned what the reference answered (float64
    where float32 is declared, one element short, a NumPy array); only the server checked. Now each route, the
    compiled table's reference row included, raises a DeclarationError naming the output, what it got and what is
    declared."""
    from tileship.runtime.loader import load
    from tileship.torchops.custom_ops import register

    rel = load(user_build.path)
    ops = register(rel)
    a = torch.arange(8.0)
    for model, words in (("wrong_dtype", "output 'b' of the call is float64 [8]; the operator declares it float32 [8]"),
                         ("wrong_shape", "output 'b' of the call is float32 [7]; the operator declares it float32 [8]"),
                         ("numpy_answer", "the call answered ndarray; the operator declares 1 output tensor(s)")):
        op = rel.op(model)
        for way in (lambda: op(a), lambda: op(a), lambda: op.call(a), lambda: op(a, out=torch.empty(8)),
                    lambda: getattr(ops, model)(a), lambda: ops.eager(model)(a)):
            with pytest.raises(DeclarationError) as info:
                way()
            assert info.value.field == "reference" and f"{model}.reference: {words}" in str(info.value)
        assert rel.counters()[model] == {"reference:build_failed": 6}, rel.counters()[model]
    x = torch.randn(4, 6)  # the release goes on serving
    assert torch.equal(rel.op("interleave")(x, 2.0), user_ops.interleave_ref(x, 2.0))


def test_outputs_are_read_from_a_shape_the_factory_takes_when_the_first_it_refuses():
    """Outputs omitted (a ``T.empty`` kernel) and the first declared shape one the factory refuses (N=100 > 64):
    the outputs were read from that shape alone, so its ValueError refused the whole operator and no shape built.
    It now fails only that specialization's build; the outputs are read from N=32."""
    from tileship.declare.outputs import infer_outputs
    from tileship.declare.spec import Operator, TensorArg

    op = Operator(name="rs", factory=user_ops.row_sum_small, reference=user_ops.row_sum_ref,
                  inputs=(TensorArg("X", ("M", "N")),), dtypes=("float32",), targets=("c",),
                  shapes=({"M": 4, "N": 100}, {"M": 4, "N": 32}))
    assert infer_outputs(op).outputs == (TensorArg("S", ("M",)),)
    with pytest.raises(DeclarationError) as info:  # no shape it takes: still refused, naming the first failure
        infer_outputs(dataclasses.replace(op, shapes=({"M": 4, "N": 100}, {"M": 4, "N": 200})))
    assert info.value.field == "outputs" and "at M4_N100" in str(info.value) and "N=100 is over 64" in str(info.value)
