"""``serve.plans``: a kept plan is the plan ``call_plan.plan_call`` makes, around each request's own inputs;
refusals are never kept; another declaration object (a new release) is planned afresh."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tileship.serve import call_plan, protocol
from tileship.serve.plans import Plans
from tileship.serve.validate import BadRequest

DECL: dict[str, Any] = {"inputs": [["A", ["N"]], ["B", ["N"]]], "outputs": [["C", ["N"]]],
                        "dtypes": ["float32"], "shapes": [{"N": 4}]}


def _request(n: int, order: tuple[str, ...] = ("A", "B"), dtype: str = "FP32", out: str = "C") -> Any:
    body = json.dumps({"inputs": [{"name": k, "shape": [n], "datatype": dtype, "data": list(range(n))}
                                  for k in order], "outputs": [{"name": out}]}).encode()
    return protocol.parse_infer(bytearray(body), None)


def _same(got: call_plan.CallPlan, want: call_plan.CallPlan) -> None:
    assert [i.name for i in got.inputs] == [i.name for i in want.inputs]
    assert (got.dtype, got.dims, got.declared, got.outputs, got.scalars, got.allow_nonfinite) == \
        (want.dtype, want.dims, want.declared, want.outputs, want.scalars, want.allow_nonfinite)


@pytest.mark.parametrize("n", [4, 7], ids=["declared", "undeclared"])
def test_a_kept_plan_is_plan_calls_around_the_new_requests_inputs(n):
    plans = Plans()
    for order in [("A", "B"), ("B", "A"), ("A", "B"), ("B", "A")]:
        req = _request(n, order)
        got = plans.plan(req, "add", DECL)
        _same(got, call_plan.plan_call(req, "add", DECL))
        assert all(any(x is i for i in req.inputs) for x in got.inputs)  # this request's own tensors
    assert len(plans._kept) == 2


def test_refusals_are_checked_every_time_and_a_new_declaration_is_planned_afresh():
    plans = Plans()
    for _ in range(2):
        with pytest.raises(BadRequest, match="unknown output"):
            plans.plan(_request(4, out="D"), "add", DECL)
        with pytest.raises(BadRequest, match="wrong datatype"):
            plans.plan(_request(4, dtype="FP16"), "add", DECL)
    assert not plans._kept
    plans.plan(_request(4), "add", DECL)
    other = copy.deepcopy(DECL)
    other["shapes"] = [{"N": 8}]
    assert plans.plan(_request(4), "add", other).declared is False  # not the first declaration's plan
    full = Plans(max_keys=1)
    full.plan(_request(4), "add", DECL)
    full.plan(_request(5), "add", DECL)
    assert len(full._kept) == 1
