"""Inputs an operator updates in place (``Operator.mutates``), answered as outputs.

A remote client never sees the server's copy of its inputs, so the server answers each mutated input, as it is
after the call, as an output named like the input: the declared outputs first, then the mutated inputs in the
order the declaration lists its inputs (``answered``), the order ``verify`` and the warm-up compare them in. The
names cannot clash: a declaration gives every input and output its own name, and ``mutates`` may not name an
output (``declare.checks``: both refused when the operator is declared, before any build).

Everything that reads the answered names asks here: the plan (requested outputs, ``call_plan.plan_call``), the
bytes counted against ``--max-output-mib``, the gRPC message and a shared-memory output's size (``call_plan
.output_bytes``), the answer itself (``calls.execute``, a worker's ``serve.worker``, ``remote``) and the model
metadata (``encoding.tensor_metadata``). ``check_answer`` bounds what a call answered, after it ran, where the
declaration could not size an output before it (a division that does not divide). Imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tileship.serve.validate import BadRequest
from tileship.verify.mutated import mutated_positions


def answered(decl: Mapping[str, Any]) -> list[Sequence[Any]]:
    """The ``(name, dims, ...)`` rows of what a call of the declared operator ``decl`` answers: its outputs, then
    the inputs it updates in place."""
    if not decl.get("mutates"):  # the common case
        return list(decl["outputs"])
    return [*decl["outputs"], *(decl["inputs"][i] for i in mutated_positions(decl))]


def answered_names(decl: Mapping[str, Any]) -> list[str]:
    """The names of ``answered``'s rows, in that order."""
    return [str(row[0]) for row in answered(decl)]


def with_mutated(decl: Mapping[str, Any], outs: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """``outs`` (the call's declared outputs) followed by the mutated inputs among ``args`` (the call's arguments in
    declaration order, as they are after the call): one tensor per name of ``answered_names``."""
    return [*outs, *(args[i] for i in mutated_positions(decl))] if decl.get("mutates") else list(outs)


def mutated_bytes(decl: Mapping[str, Any], inputs: Sequence[Any]) -> dict[str, int]:
    """Bytes of each input ``decl`` updates in place, from the request's ``inputs`` (``protocol.InputTensor`` in
    declaration order): the answer carries each back at the size it was sent."""
    from tileship.serve.encoding import ITEMSIZE

    sizes: dict[str, int] = {}
    for i in mutated_positions(decl) if decl.get("mutates") else ():
        inp = inputs[i]
        n = ITEMSIZE[inp.datatype]
        for s in inp.shape:
            n *= s
        sizes[inp.name] = n
    return sizes


def check_answer(model: str, names: Sequence[str], outs: Sequence[Any], limit: int) -> None:
    """``BadRequest(413)`` when the tensors a call answered (``outs``, named ``names``) hold more than ``limit`` bytes
    (``--max-output-mib``). Before the call the server counts what the declaration sizes (``validate
    .check_outputs``); an output it could not size is counted only here, so no answer past the limit is sent."""
    sizes = {n: int(o.nbytes) for n, o in zip(names, outs, strict=True)}
    total = sum(sizes.values())
    if total > limit:
        each = ", ".join(f"{n}={b}" for n, b in sizes.items())
        raise BadRequest(413, f"model {model}: this call produced {total} bytes of outputs ({each}); the limit is "
                              f"{limit} bytes (--max-output-mib); the declaration could not size every output before "
                              "the call, so it ran and its answer was dropped")
