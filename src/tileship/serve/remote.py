"""Calls in worker processes (``--workers N``): what ``calls.run`` runs instead of ``calls.execute``.

Two executors with ``calls.execute``'s contract (encoded response, decision; BadRequest for
what the client got wrong):

- ``execute_remote`` runs on a request thread, like ``calls.execute``: the request's tensors go
  into an idle worker's shared buffer, one frame goes out and one comes back
  (``serve.worker_pool``), the outputs are copied out and encoded by the transport's encoder.
- ``execute_remote_async`` does the same on the event loop. ``calls.run`` takes it for small calls
  (``on_loop``): their whole cost is a few copies of at most ``LOOP_BYTES`` plus the wait for the
  worker, which the loop does on the socket's readiness. That skips the hand-over to a request
  thread and back, which costs more than the copies (on a 2-core machine, 110-160 us a call).
  It sends the call at once, before the task that waits for the answer first runs, so the worker
  works while the loop gets round to that task. Larger calls keep the thread, so that copying and
  encoding megabytes never stalls the loop.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Coroutine
from typing import Any

from tileship.runtime.dispatch import Decision
from tileship.serve import call_plan, in_place, protocol
from tileship.serve.answer import check_declared
from tileship.serve.encoding import ITEMSIZE
from tileship.serve.validate import BadRequest
from tileship.serve.workers import Raw

_DTYPES = protocol.DATATYPES

#: a call whose inputs plus outputs are at most this many bytes runs on the event loop
LOOP_BYTES = 1 << 16


def host_bytes(plan: call_plan.CallPlan, out_bytes: dict[str, int], on_device: Any = ()) -> int:
    """The bytes a call moves through host memory: its inputs (a CUDA shared-memory window counts
    none) and its outputs (one bound for a CUDA region, named in ``on_device``, counts none)."""
    total = sum(n for name, n in out_bytes.items() if name not in on_device)
    for inp in plan.inputs:
        if inp.fetch is None:
            n = ITEMSIZE[inp.datatype]
            for s in inp.shape:
                n *= s
            total += n
    return total


def on_loop(service: Any, plan: call_plan.CallPlan, out_bytes: dict[str, int]) -> bool:
    """Whether ``calls.run`` runs this call with ``execute_remote_async`` (workers, small tensors,
    no CUDA window: those need the in-process mode)."""
    return (service.workers is not None and all(inp.fetch is None for inp in plan.inputs)
            and host_bytes(plan, out_bytes) <= LOOP_BYTES)


def _arguments(plan: call_plan.CallPlan) -> list[Any]:
    args: list[Any] = []
    for i, inp in enumerate(plan.inputs):
        if inp.fetch is not None:  # registration refuses it first (Regions.cuda_off)
            raise BadRequest(400, "CUDA shared-memory inputs need the in-process mode (--workers 0)")
        if i in plan.scalars:
            args.append(protocol.to_tensor(inp, "cpu").item())
        elif inp.raw is not None:
            args.append(Raw(protocol.raw_bytes(inp), inp.shape, _DTYPES[inp.datatype]))  # a BOOL one checked
        else:
            args.append(protocol.to_tensor(inp, "cpu"))
    return args


def _encode(service: Any, served: Any, name: str, plan: call_plan.CallPlan, kserve_id: str | None, encode: Any,
            outs: list[Any], decision: Decision) -> Any:
    """Encode a worker's answer: its declared outputs, then the inputs it updated in place (``serve.in_place``)."""
    from tileship.serve.calls import parameters

    rel = served.release
    decl = rel.declarations[name]
    out_names = in_place.answered_names(decl)
    check_declared(name, outs[:len(decl["outputs"])], decl, plan.dtype, plan.dims)
    in_place.check_answer(name, out_names, outs, service.config.limits.max_output_bytes)
    outputs = [(n, outs[out_names.index(n)], binary) for n, binary in plan.outputs]
    return encode(model=name, version=rel.release_id, request_id=kserve_id, parameters=parameters(served, decision),
                  outputs=outputs, allow_nonfinite=plan.allow_nonfinite)


def _out_bytes(served: Any, name: str, plan: call_plan.CallPlan) -> int:
    return sum(call_plan.output_bytes(served.release.declarations[name], plan).values())


def keywords(service: Any, timeout_us: int, out_bytes: dict[str, int]) -> dict[str, Any]:
    """The remote executors' keywords under ``--workers N`` (``{}`` in process): ``out_bytes``, the outputs' bytes
    ``calls.run`` has counted already, and for a request's ``timeout`` (us; 0: none) ``deadline``, taken now (as
    ``handoff.outcome``'s queue deadline): ``time.monotonic() + ...``."""
    if service.workers is None:
        return {}
    kw: dict[str, Any] = {"out_bytes": sum(out_bytes.values())}
    if timeout_us:
        kw["deadline"] = time.monotonic() + timeout_us * 1e-6
    return kw


def execute_remote(service: Any, served: Any, name: str, plan: call_plan.CallPlan, kserve_id: str | None,
                   encode: Any, deadline: float | None = None, out_bytes: int | None = None) -> tuple[Any, Decision]:
    """``calls.execute`` for ``--workers N``: same contract, the call runs in a worker process. ``deadline``
    (``time.monotonic()``, from ``keywords``) bounds the wait for an idle worker: past it ``handoff.QueueTimeout``
    (a TimeoutError: ``calls.run`` answers 504), the call never run. ``out_bytes``: the outputs' bytes (None:
    counted here)."""
    args = _arguments(plan)
    if out_bytes is None:
        out_bytes = _out_bytes(served, name, plan)
    outs, decision = service.workers.call(served.release.release_id, name, args, out_bytes, deadline)
    return _encode(service, served, name, plan, kserve_id, encode, outs, decision), decision


def execute_remote_async(service: Any, served: Any, name: str, plan: call_plan.CallPlan, kserve_id: str | None,
                         encode: Any, out_bytes: int | None = None) -> Coroutine[Any, Any, tuple[Any, Decision]]:
    """``execute_remote`` on the event loop (for calls that ``on_loop`` accepts), started now: the call goes to a
    worker idle now before this returns (``WorkerPool.acall``); await what it returns for the rest. Raises
    BadRequest now for what is wrong before any worker runs it."""
    args = _arguments(plan)
    if out_bytes is None:
        out_bytes = _out_bytes(served, name, plan)
    return _encode_after(service, served, name, plan, kserve_id, encode,
                         service.workers.acall(served.release.release_id, name, args, out_bytes))


async def _encode_after(service: Any, served: Any, name: str, plan: call_plan.CallPlan, kserve_id: str | None,
                        encode: Any, answer: Awaitable[tuple[list[Any], Decision]]) -> tuple[Any, Decision]:
    outs, decision = await answer
    return _encode(service, served, name, plan, kserve_id, encode, outs, decision), decision
