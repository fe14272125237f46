"""A parsed inference request checked against an operator's declaration: the ``CallPlan`` a call runs from.

``plan_call`` orders the inputs as declared and checks names, datatypes (per tensor, or the operator dtype
all "same" inputs agree on), scalars, ranks and dims (bound as the dispatcher binds them, derived dims
included), and picks the outputs to answer (the declared ones, then the inputs it updates in place:
``serve.in_place``). Every problem raises ``BadRequest(400)`` naming the input and what
the model declares; whether a shape outside the declared set is served (by the reference) or refused is the
caller's policy (``CallPlan.declared``). ``output_bytes`` sizes the outputs of a planned call. Pure functions
over a ``protocol.InferRequest`` and the release's declarations; ``serve.plans`` keeps their results.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tileship.declare.dims import SAME, DimExpr, bind
from tileship.serve.encoding import DATATYPES, ITEMSIZE, KSERVE
from tileship.serve.in_place import answered_names, mutated_bytes
from tileship.serve.protocol import InferRequest, InputTensor, to_tensor
from tileship.serve.validate import BadRequest, in_declared_set, short
from tileship.serve.validate import output_bytes as _output_bytes
from tileship.verify.mutated import mutated_positions


@dataclass
class CallPlan:
    """A request checked against a declaration: inputs in declaration order, ready to run."""

    inputs: list[InputTensor]
    dtype: str                   # torch dtype name
    dims: dict[str, int]
    declared: bool               # the shape lies in the declared set
    outputs: list[tuple[str, bool]]  # (name, binary) in response order
    #: positions of ScalarArg inputs (sent as one-element tensors, passed as Python numbers)
    scalars: tuple[int, ...] = ()
    allow_nonfinite: bool = False
    #: positions of the inputs the operator updates in place (``Operator.mutates``)
    mutated: tuple[int, ...] = ()
    #: where the call's time went, in ms (``calls.execute`` fills it; the ``infer`` log line carries it)
    spans: dict[str, float] = field(default_factory=dict)

    def arguments(self, device: str) -> list[Any]:
        """The call's arguments: tensors on ``device``, scalars as Python numbers. An input the operator updates in
        place is never a client's shared-memory window: one read in place (CUDA) is copied first, the others stay
        views of it (a system region's bytes are always copied out: ``shm_requests.attach``)."""
        return [to_tensor(inp, "cpu").item() if i in self.scalars else to_tensor(inp, device, own=i in self.mutated)
                for i, inp in enumerate(self.inputs)]


def plan_call(req: InferRequest, model: str, decl: Mapping[str, Any]) -> CallPlan:
    """Order the inputs as declared and check names, datatypes, ranks and dims.

    ``CallPlan.declared`` says whether the shape is in the declared set; what to do when it
    is not (reference or 400) is the caller's policy.
    """
    declared_inputs: list[tuple[str, list[str]]] = [(n, list(d)) for n, d, *_ in decl["inputs"]]
    names = [n for n, _ in declared_inputs]
    by_name: dict[str, InputTensor] = {}
    for inp in req.inputs:
        if inp.name in by_name:
            raise BadRequest(400, f"input {inp.name} is given twice")
        if inp.name not in names:
            raise BadRequest(400, f"unknown input {short(inp.name)}: model {model} takes {', '.join(names)}")
        by_name[inp.name] = inp
    missing = [n for n in names if n not in by_name]
    if missing:
        raise BadRequest(400, f"missing input {', '.join(missing)}: model {model} takes {', '.join(names)}")
    ordered = [by_name[n] for n in names]
    exprs = decl.get("tensor_dtypes") or {}
    accepted = [KSERVE[d] for d in decl["dtypes"]]
    same = [inp for inp in ordered if exprs.get(inp.name, SAME) == SAME]
    for inp in ordered:
        want = exprs.get(inp.name, SAME)
        if want != SAME and DATATYPES[inp.datatype] != want:
            raise BadRequest(400,
                             f"wrong datatype: input {inp.name} is {inp.datatype}; model {model} declares it "
                             f"{KSERVE[want]}")
        if want == SAME and DATATYPES[inp.datatype] not in decl["dtypes"]:
            raise BadRequest(400,
                             f"wrong datatype: input {inp.name} is {inp.datatype}; model {model} accepts "
                             f"{', '.join(accepted)}")
    kinds = {inp.datatype for inp in same}
    if len(kinds) > 1:
        raise BadRequest(400,
                         f"wrong datatype: inputs disagree ({', '.join(f'{i.name}={i.datatype}' for i in same)}); send "
                         "one datatype")
    scalar_names = set(decl.get("scalars") or ())
    for inp in ordered:
        if inp.name in scalar_names and list(inp.shape) not in ([], [1]):
            raise BadRequest(400,
                             f"wrong shape: input {inp.name} is a scalar; send shape [1] (or []), got "
                             f"{list(inp.shape)}")
    tensors = [(inp, d) for inp, d in zip(ordered, declared_inputs, strict=True) if inp.name not in scalar_names]
    b = bind([d for _, d in tensors], [inp.shape for inp, _ in tensors])
    if b.problem == "rank":
        ds = dict(declared_inputs)[b.argument]  # type: ignore[index]
        shape = list(by_name[b.argument].shape)  # type: ignore[index]
        raise BadRequest(400, f"wrong rank: input {b.argument} has shape {shape} (rank {len(shape)}); "
                              f"model {model} declares {b.argument} as ({', '.join(ds)}) (rank {len(ds)})")
    seen: dict[str, tuple[int, str]] = {}
    for inp, (name, ds) in tensors:
        for d, size in zip(ds, inp.shape, strict=True):
            if size == 0:
                raise BadRequest(400,
                                 f"shape outside the declared set: input {name} has {d}=0; every declared dim is at "
                                 "least 1")
            if DimExpr.parse(d).derived or DimExpr.parse(d).literal:  # bind checks these
                continue
            first, where = seen.setdefault(d, (size, name))
            if first != size:
                raise BadRequest(400, f"wrong shape: dim {d} is {first} in input {where} but {size} in input {name}")
    if b.problem == "derived":
        raise BadRequest(400, f"wrong shape: input {b.argument}: {b.message}")
    dims = b.dims
    out_names = answered_names(decl)  # the declared outputs, then the inputs updated in place
    if req.outputs:
        outputs, asked = [], set()
        for name, binary in req.outputs:
            if name not in out_names:
                raise BadRequest(400, f"unknown output {short(name)}: model {model} produces {', '.join(out_names)}")
            if name in asked:  # as Triton: one answer per output, and one shared-memory place for it
                raise BadRequest(400, f"output {name} is requested twice")
            asked.add(name)
            outputs.append((name, req.binary_output if binary is None else binary))
    else:
        outputs = [(n, req.binary_output) for n in out_names]
    return CallPlan(ordered, DATATYPES[same[0].datatype] if same else decl["dtypes"][0], dims,
                    in_declared_set(decl, dims), outputs,
                    tuple(i for i, inp in enumerate(ordered) if inp.name in scalar_names), req.allow_nonfinite,
                    mutated_positions(decl))


def output_bytes(decl: Mapping[str, Any], plan: CallPlan) -> dict[str, int]:
    """Bytes of each output of ``plan``'s call (``validate.output_bytes`` at this call's dtype): an output of a
    literal dtype is counted whether or not the operator's dtypes list it; an input the operator updates in place
    is answered too, at the size it was sent (``in_place``)."""
    return {**_output_bytes(decl, plan.dims, plan.dtype, _ITEMSIZE), **mutated_bytes(decl, plan.inputs)}


#: torch dtype name -> bytes per element, for every dtype a declaration may name
_ITEMSIZE = {name: ITEMSIZE[kserve] for name, kserve in KSERVE.items()}
