"""Plans of recurring requests: ``call_plan.plan_call``'s result for one request signature, kept.

``plan_call`` is a pure function of the declaration and of a request's input names, datatypes and
shapes, its requested outputs (names and binary flags) and its ``binary_data_output``: requests that
agree on all of those get the same plan (inputs put in the same order, the same dtype, dims,
declared-ness, outputs and scalar positions) or the same refusal. ``Plans.plan`` keeps the plans by
that signature, per declaration object, and builds each request's ``CallPlan`` from the kept one
around the request's own inputs; a refusal is never kept (the next such request is checked, and
refused, again). Used on the event loop only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tileship.serve.call_plan import CallPlan, plan_call
from tileship.serve.protocol import InferRequest

#: signatures ``Plans`` keeps; past it, it forgets them all and plans again
MAX_KEYS = 1024


class Plans:
    """Kept ``plan_call`` results (see the module doc)."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._kept: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def plan(self, req: InferRequest, model: str, decl: Mapping[str, Any]) -> CallPlan:
        """``plan_call(req, model, decl)``: the same plan, or the same BadRequest."""
        inputs = req.inputs
        key = (model, id(decl), req.binary_output, tuple(req.outputs),
               *[(inp.name, inp.datatype, inp.shape) for inp in inputs])
        kept = self._kept.get(key)
        if kept is not None and kept[0] is decl:  # the same declaration object, not one at a reused address
            _, order, dtype, dims, declared, outputs, scalars, mutated = kept
            return CallPlan([inputs[j] for j in order], dtype, dict(dims), declared, list(outputs), scalars,
                            req.allow_nonfinite, mutated)
        plan = plan_call(req, model, decl)
        order = tuple(next(j for j, x in enumerate(inputs) if x is inp) for inp in plan.inputs)
        if len(self._kept) >= self.max_keys:
            self._kept.clear()
        self._kept[key] = (decl, order, plan.dtype, dict(plan.dims), plan.declared, tuple(plan.outputs), plan.scalars,
                             plan.mutated)
        return plan
