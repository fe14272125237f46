"""A reference that answers other than declared, called in process (``release.op(name)(...)``, ``.call``, ``out=``,
the torch custom op, the circuit breaker's rerun): float64 where float32 is declared, the wrong shape, a NumPy
array, a tuple of the wrong length, a tensor from an operator with no outputs. Each was returned to the caller as
it came (only the server checked it); each is now a ``DeclarationError`` naming the operator, the output, what it
got and what is declared, on every route through the dispatcher (``runtime.answer``)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from tileship.declare.spec import Specialization
from tileship.errors import DeclarationError
from tileship.runtime.dispatch import KERNEL, Decision, Entry, OpRunner, OpShape

ONE = OpShape("scale", (("X", ("M", "N")),), 1, outputs=(("Y", ("M", "N")),), out_dtypes=("same",))
TWO = OpShape("split", (("X", ("M", "N")),), 2, outputs=(("Y", ("M", "N")), ("S", ("M",))),
              out_dtypes=("same", "float32"))
NONE = OpShape("bump", (("X", ("M", "N")),), 0, mutates=(0,))

WRONG = [  # (id, shape, reference, the words of the error)
    ("float64", ONE, lambda x: x.double(), "output 'Y' of the call is float64 [4, 8]; the operator declares it "
                                           "float32 [4, 8] for this call"),
    ("a-row-short", ONE, lambda x: x[:-1], "output 'Y' of the call is float32 [3, 8]; the operator declares it "
                                           "float32 [4, 8]"),
    ("transposed", ONE, lambda x: x.t(), "output 'Y' of the call is float32 [8, 4]"),
    ("numpy", ONE, lambda x: x.numpy(), "the call answered ndarray; the operator declares 1 output tensor(s)"),
    ("none", ONE, lambda x: None, "the call answered nothing; the operator declares 1 output tensor(s)"),
    ("tuple-of-one", ONE, lambda x: (x,), "the call answered a tuple of 1 (Tensor); the operator declares 1"),
    ("list-of-one", ONE, lambda x: [x * 2], "the call answered a list of 1 (Tensor)"),
    ("two-of-three", TWO, lambda x: (x, x.sum(1), x), "the call answered a tuple of 3 (Tensor, Tensor, Tensor); "
                                                       "the operator declares 2 output tensor(s)"),
    ("two-of-one", TWO, lambda x: x, "the call answered Tensor; the operator declares 2 output tensor(s)"),
    ("second-float16", TWO, lambda x: (x, x.sum(1).half()), "output 'S' of the call is float16 [4]; the operator "
                                                            "declares it float32 [4]"),
    ("second-a-list", TWO, lambda x: [x, x.sum(1).tolist()], "the call answered a tuple of 2 (Tensor, list)"),
    ("no-outputs", NONE, lambda x: x.add_(1), "the call answered Tensor; the operator declares 0 output tensor(s)"),
    ("on-meta", ONE, lambda x: torch.empty_like(x, device="meta"), "output 'Y' of the call is on meta; the call's "
                                                                   "inputs are on cpu"),
    ("second-on-meta", TWO, lambda x: (x, x.sum(1).to("meta")), "output 'S' of the call is on meta; the call's "
                                                                 "inputs are on cpu"),
    ("undeclared-on-meta", OpShape("scale", (("X", ("M", "N")),), 1), lambda x: x.to("meta"),
     "output 0 of the call is on meta; the call's inputs are on cpu"),
]


def _calls(op: OpRunner, x: torch.Tensor) -> list[tuple[str, Any]]:
    """Every in-process way into the reference route: the first call of a key, the memoized one (inlined in
    ``__call__``) and its timed sample, ``.call``, ``out=``."""
    ways: list[tuple[str, Any]] = [("op()", lambda: op(x)), ("op() again", lambda: op(x)),
                                   ("op.call()", lambda: op.call(x))]
    ways += [(f"op() #{i}", lambda: op(x)) for i in range(3, 70)]  # past one SAMPLE: the timed call too
    if op.shape.n_outputs == 1:
        ways.append(("out=", lambda: op(x, out=torch.empty(4, 8))))
    return ways


@pytest.mark.parametrize("name,shape,reference,words", WRONG, ids=[w[0] for w in WRONG])
def test_an_answer_unlike_the_declaration_is_refused_on_every_in_process_route(name, shape, reference, words):
    op = OpRunner(shape, reference, [])  # no kernel: every call is the reference's (undeclared_shape)
    x = torch.randn(4, 8)
    for way, call in _calls(op, x):
        with pytest.raises(DeclarationError) as info:
            call()
        e = info.value
        assert (e.operator, e.field) == (shape.name, "reference"), (way, str(e))
        assert words in str(e) and f"{shape.name}.reference: " in str(e), (way, str(e))


@pytest.mark.parametrize("i", range(6), ids=[w[0] for w in WRONG[:6]])
def test_the_torch_custom_op_and_the_breakers_rerun_refuse_it_too(i):
    """The custom op (``runner.call``) and a kernel whose NaN the reference reruns (``check_finite``)."""
    from tileship.runtime.dispatch import Release
    from tileship.torchops.custom_ops import register

    _, shape, reference, words = WRONG[i]
    decl = {"inputs": [["X", ["M", "N"]]], "outputs": [["Y", ["M", "N"]]], "dtypes": ["float32"]}
    rid = f"f00d0000000a{i:04d}"
    release = Release(release_id=rid, path=None, kernel_revision="test", model={}, lock={}, lock_digest="",
                      drift=None, ops={"scale": OpRunner(shape, reference, [])}, declarations={"scale": decl})
    with pytest.raises(DeclarationError, match=re.escape(words)):
        register(release).scale(torch.randn(4, 8))
    spec = Specialization("scale", "float32", (("M", 4), ("N", 8)), "c")
    nan = Entry(spec, lambda x: torch.full_like(x, float("nan")), Decision(KERNEL, KERNEL, spec.id))
    op = OpRunner(shape, reference, [nan], check_finite=True)
    with pytest.raises(DeclarationError, match=re.escape(words)):
        op(torch.randn(4, 8))


def test_an_answer_as_declared_is_returned_as_it_came():
    """Tensor subclasses, a list for several outputs (a tuple back), None for an operator with no outputs, and an
    undeclared dtype whose "same" output follows the call's dtype, all pass."""
    x = torch.randn(4, 8)
    p = torch.nn.Parameter(x.clone(), requires_grad=False)
    assert OpRunner(ONE, lambda x: p, [])(x) is p
    y, s = OpRunner(TWO, lambda x: [x, x.sum(1)], [])(x)
    assert torch.equal(y, x) and torch.equal(s, x.sum(1))
    assert OpRunner(NONE, lambda x: None, [])(x) is None
    assert OpRunner(ONE, lambda x: x * 2, [])(x.double()).dtype == torch.float64
    unknown = OpShape("scale", (("X", ("M", "N")),), 1)  # outputs not declared: only the count and type
    assert OpRunner(unknown, lambda x: x.t(), [])(x).shape == (8, 4)


def test_inputs_of_the_operator_dtype_that_disagree_leave_the_output_dtype_to_the_reference():
    """float32 and float64 where both are "same" (``undeclared_dtype``: the reference serves): torch promotes, and
    nothing declares which one the output has; its shape is still held (a row short is refused)."""
    shape = OpShape("add", (("A", ("N",)), ("B", ("N",))), 1, outputs=(("C", ("N",)),), out_dtypes=("same",))
    a, b = torch.randn(8), torch.randn(8, dtype=torch.float64)
    y, d = OpRunner(shape, lambda a, b: a + b, []).call(a, b)
    assert y.dtype == torch.float64 and d.path == "reference", d
    with pytest.raises(DeclarationError, match=r"output 'C' of the call is float64 \[7\]"):
        OpRunner(shape, lambda a, b: (a + b)[1:], [])(a, b)


# -- tileship verify, tune and demo call the reference directly: the same check, the same words ----------------

SPEC = Specialization("scale", "float32", (("M", 4), ("N", 8)), "c")
DESC = {"inputs": [["X", ["M", "N"]]], "outputs": [["Y", ["M", "N"]]], "dtypes": ["float32"], "config": {},
        "tolerances": {"float32": {"atol": 1e-4, "rtol": 1e-4}}}
#: the references of WRONG for the one-output operator (``scale``: Y = 2 X), whose kernel is right
OF_ONE = [w for w in WRONG if w[1] is ONE or w[0] == "undeclared-on-meta"]


def _twice(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype)  # allocated as a kernel's output is (the poison goes there)
    out.copy_(x * 2)
    return out


@pytest.mark.parametrize("name,shape,reference,words", OF_ONE, ids=[w[0] for w in OF_ONE])
def test_verify_fails_the_verdict_of_a_reference_unlike_its_declaration_with_the_dispatchers_words(name, shape,
                                                                                                   reference, words):
    """A NumPy array and a meta tensor crashed the whole verify run (AttributeError 'numel', NotImplementedError
    'Cannot copy out of meta tensor'); a row short was blamed on the kernel ("output shape (4, 8) != reference
    shape (3, 8)"), and the transposed answer or a list of one got other words than the ones a served call meets."""
    from tileship.verify.spec_check import VerifyOptions, verify_spec

    words = words.replace("output 0 ", "output 'Y' ")  # the declaration names it here
    v = verify_spec(SPEC, _twice, reference, DESC, options=VerifyOptions(seeds=(0,), timing=False))
    assert not v.passed and v.failure.startswith("at M=4,N=8: scale.reference: ") and words in v.failure, v.failure
    assert verify_spec(SPEC, _twice, lambda x: x * 2, DESC, options=VerifyOptions(seeds=(0,), timing=False)).passed


def test_a_whole_verify_run_reports_such_a_reference_as_failed_verdicts(cpu_release, monkeypatch):
    """``tileship verify`` on a release whose reference answers a NumPy array: each verdict fails naming it, the
    run itself completes (it raised AttributeError from the comparison)."""
    from tileship.runtime import references
    from tileship.verify.spec_check import VerifyOptions
    from tileship.verify.verify import verify

    real = references.import_reference
    monkeypatch.setattr(references, "import_reference", lambda desc, op: (lambda *a: real(desc, op)(*a).numpy()))
    result = verify(cpu_release, VerifyOptions(seeds=(0,), timing=False, only=("add",)), write=False)
    assert result.verdicts and all(not v.passed for v in result.verdicts), result.verdicts
    for v in result.verdicts:
        assert "add.reference: the call answered ndarray; the operator declares 1 output tensor(s)" in v.failure, \
            v.failure


@pytest.mark.parametrize("name,shape,reference,words", OF_ONE, ids=[w[0] for w in OF_ONE])
def test_tune_records_a_reference_unlike_its_declaration_as_the_groups_failure_before_timing_it(name, shape,
                                                                                               reference, words):
    """A NumPy array or a meta tensor crashed ``tune`` with a traceback from the comparison; then the group's
    reference was called once per point through the dispatcher's check and its DeclarationError stopped the whole
    run. Now the group comes back failed, naming the point and the words, with nothing verified or timed."""
    from tileship.verify.tune import TuneOptions, tune_group

    words = words.replace("output 0 ", "output 'Y' ")
    opts = TuneOptions(seeds=(0,), budget_ms=1.0, warmup_ms=1.0, min_repeats=1, max_repeats=2, rounds=2,
                       confirm_rounds=0, flush=False, clock="events")
    kernel_calls = []

    def kernel(x: torch.Tensor) -> torch.Tensor:
        kernel_calls.append(1)
        return _twice(x)

    group, verdicts = tune_group("scale.float32.c", [(SPEC.id, SPEC, kernel)], reference, DESC, options=opts)
    assert verdicts == [] and group["points"] == [] and not kernel_calls, group
    assert group["failed"]["dims"] == {"M": 4, "N": 8}, group
    reason = group["failed"]["reason"]
    assert reason.startswith("scale.reference: ") and words in reason, reason


def test_tune_records_a_reference_that_raises_as_the_groups_failure() -> None:
    """A reference that raises (not a declaration break) stopped the run with its traceback: now it is the
    group's failure, in the words verify uses for it."""
    from tileship.verify.tune import TuneOptions, tune_group

    def broken(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("no such mode")

    opts = TuneOptions(seeds=(0,), budget_ms=1.0, warmup_ms=1.0, min_repeats=1, max_repeats=2, rounds=2,
                       confirm_rounds=0, flush=False, clock="events")
    group, verdicts = tune_group("scale.float32.c", [(SPEC.id, SPEC, _twice)], broken, DESC, options=opts)
    assert verdicts == [] and group["points"] == [], group
    assert group["failed"] == {"dims": {"M": 4, "N": 8}, "reason": "the reference raised ValueError: no such mode"}

    def poisoned(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):  # every later group would fail the same way
        tune_group("scale.float32.c", [(SPEC.id, SPEC, _twice)], poisoned, DESC, options=opts)


CAST = [w for w in OF_ONE if w[0] != "float64"]  # the demo runs the reference on float64 inputs: dtypes open


@pytest.mark.parametrize("name,shape,reference,words", CAST, ids=[w[0] for w in CAST])
def test_the_demo_names_such_a_reference_in_a_failed_row(name, shape, reference, words):
    """The demo compared the kernel with the reference called directly: a NumPy array or a meta tensor raised
    (AttributeError 'double', NotImplementedError), a row short broadcast or raised a size mismatch."""
    from tileship.runtime.dispatch import Release
    from tileship.verify.demo import exercise

    words = words.replace("output 0 ", "output 'Y' ")
    ok = OpShape("scale", (("X", ("M", "N")),), 1, outputs=(("Y", ("M", "N")),), out_dtypes=("same",))
    runner = OpRunner(ok, reference, [Entry(SPEC, _twice, Decision(KERNEL, KERNEL, SPEC.id))])
    release = Release(release_id="f00d0000000b0001", path=None, kernel_revision="test", model={}, lock={},
                      lock_digest="", drift=None, ops={"scale": runner}, declarations={"scale": DESC})
    rows = exercise(release)
    assert [(r["ok"], r["path"]) for r in rows] == [(False, "kernel")], rows
    reason = rows[0]["reason"]
    assert reason.startswith("scale.reference: ") and words.replace("float32", "float64") in reason, reason


# -- the server checks again, per call plan (``serve.answer``): the device too -------------------------------------

SERVED = {"inputs": [["X", ["M", "N"]]], "outputs": [["Y", ["M", "N"]], ["S", ["M"]]], "dtypes": ["float32"]}
ON_META = [  # (id, the answer to X = randn(4, 8), the words the dispatcher uses for it: WRONG's)
    ("on-meta", lambda x: (torch.empty_like(x, device="meta"), x.sum(1)), "output 'Y' of the call is on meta; "
                                                                          "the call's inputs are on cpu"),
    ("second-on-meta", lambda x: (x, x.sum(1).to("meta")), "output 'S' of the call is on meta; the call's inputs "
                                                           "are on cpu"),
]


@pytest.mark.parametrize("name,answer,words", ON_META, ids=[w[0] for w in ON_META])
def test_the_servers_check_holds_the_answers_device_to_the_inputs_as_the_dispatcher_does(name, answer, words):
    """``serve.answer.check_declared`` held dtypes and shapes only: an output on meta where the call's inputs are
    on the CPU passed it (then crashed the copy to the host). It now names the output, its device and the inputs',
    in the dispatcher's words; with no device (a worker's copies, checked in the worker) it is not held."""
    from tileship.serve.answer import check_declared, inputs_device

    x = torch.randn(4, 8)
    outs = answer(x)
    assert inputs_device([x, 0.5]) == torch.device("cpu") and inputs_device([0.5]) is None
    with pytest.raises(DeclarationError) as info:
        check_declared("split", outs, SERVED, "float32", {"M": 4, "N": 8}, inputs_device([x]))
    e = info.value
    assert (e.operator, e.field) == ("split", "reference") and f"split.reference: {words}" in str(e), str(e)
    check_declared("split", outs, SERVED, "float32", {"M": 4, "N": 8})  # no device given: not held
    check_declared("split", (x, x.sum(1)), SERVED, "float32", {"M": 4, "N": 8}, inputs_device([x]))


@pytest.mark.parametrize("name,answer,words", ON_META, ids=[w[0] for w in ON_META])
def test_a_worker_refuses_an_answer_on_another_device_before_copying_it_out(name, answer, words):
    """``serve --workers N``: past the shared buffer every output is a CPU copy, so the front-end cannot tell where
    the answer was; the worker copied a meta output out (NotImplementedError out of the call: the worker died) or a
    CPU one of a CUDA call (served). The worker now answers a 500 naming the output, its device and the inputs'."""
    from types import SimpleNamespace

    from tileship.runtime.dispatch import REFERENCE
    from tileship.serve import worker_wire as wire
    from tileship.serve.worker import _call

    class Runner:  # a backend answering as the reference did, without the dispatcher's own check
        def call(self, x: torch.Tensor) -> tuple[Any, Decision]:
            return answer(x), Decision(REFERENCE, "build_failed")

    served = SimpleNamespace(release=SimpleNamespace(ops={"split": Runner()}, declarations={"split": SERVED}),
                             devices={"split": "cpu"})
    buf = wire.Buffer.create(1 << 16)
    try:
        arg = buf.put(0, torch.randn(4, 8))
        reply = _call(served, buf, {"id": 7, "name": "split", "args": [arg], "out": [4096, 4096]})
        assert reply["status"] == 500 and f"split.reference: {words}" in reply["error"], reply
        ok = SimpleNamespace(call=lambda x: ((x, x.sum(1)), Decision(REFERENCE, "build_failed")))
        served.release.ops["split"] = ok
        reply = _call(served, buf, {"id": 8, "name": "split", "args": [arg], "out": [4096, 4096]})
        assert reply["ok"] and [d["shape"] for d in reply["outs"]] == [[4, 8], [4]], reply
    finally:
        buf.close()


def test_held_at_works_out_the_declared_outputs_at_a_sample_shape_for_warm_up_and_the_demo():
    """Serve's warm-up (``_held``) and the demo (``_shape``) each worked out the declared outputs at a sample shape
    with their own copy of the logic; both now call ``spec_check.held_at``: each output's shape at the dims (not
    checked where the dims cannot tell it), its declared dtype for a specialization's dtype, open for float64."""
    from tileship.verify.spec_check import held_at

    desc = {**DESC, "outputs": [["Y", ["M", "N"]], ["S", ["M", "R"]]], "tensor_dtypes": {"S": "int32"}}
    x = torch.ones(4, 8)

    def good(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return t * 2, torch.zeros(4, 3, dtype=torch.int32)

    assert held_at("split", good, desc, {"M": 4, "N": 8}, [x], dtype="float32")(x)[0].shape == (4, 8)  # R: open
    with pytest.raises(DeclarationError, match=re.escape("output 'Y' of the call is float32 [3, 8]; the operator "
                                                         "declares it float32 [4, 8]")):
        held_at("split", lambda t: (t[:-1], torch.zeros(4, 3, dtype=torch.int32)), desc, {"M": 4, "N": 8}, [x],
                dtype="float32")(x)
    with pytest.raises(DeclarationError, match=re.escape("output 'S' of the call is float32 [4, 3]; the operator "
                                                         "declares it int32 ['M', 'R']")):
        held_at("split", lambda t: (t, torch.zeros(4, 3)), desc, {"M": 4, "N": 8}, [x], dtype="float32")(x)
    as_cast = held_at("split", lambda t: (t.double(), torch.zeros(4, 3, dtype=torch.float64)), desc,
                      {"M": 4, "N": 8}, [x], dtype=None)  # the demo's reference on float64 inputs: dtypes open
    assert as_cast(x)[0].dtype == torch.float64
