"""One inference request through the server, whatever carried it (REST or gRPC).

``run(service, call)`` is the whole path after the transport has named the model: route (canary or active release) ->
readiness (503) -> model and version (404) -> unloaded (404; 503 when the request names the version) ->
``call.read()`` (the transport reads and parses its request into a ``protocol.InferRequest``; REST checks Content-Type
and reads the body here, outside admission) -> plan against the declaration (400), ``--strict-shapes`` (400), output
bytes (413; 400 ``shm_requests.check_sizes``) -> shared-memory inputs read, outputs' windows checked (``attach``:
400/404) -> admission (503) -> the call on a worker thread with a deadline (504; the request's own ``timeout``
parameter bounds its wait for the thread: ``serve.request_params``) -> ``call.encode`` on the worker -> metrics,
statistics, canary window, one log line, and a trace when ``serve.trace``'s settings sample the request.
The call itself is ``service.executor``: ``execute`` here, or ``remote.execute_remote`` (the same contract, in a worker
process: ``serve.worker_pool``) with ``--workers N``; small calls to workers run on the event loop instead of a thread
(``remote.execute_remote_async``, admitted the same way), and in process small calls a kernel served quickly before
run on the loop itself (``handoff``: the three ways, their price). ``run`` never raises: a bug is a logged 500.

The transports differ only in ``Call.read`` and ``Call.encode`` (``protocol.encode_response`` for REST,
``serve.grpc_codec.encode`` for gRPC), so validation, routing, admission, metrics and readiness cannot drift.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tileship.errors import CallError
from tileship.runtime.device_faults import is_sticky_fault
from tileship.runtime.dispatch import REFERENCE, Decision
from tileship.serve import call_plan, extensions, handoff, in_place, protocol, remote, shm_requests, validate
from tileship.serve.answer import check_declared, inputs_device, outputs_of
from tileship.serve.canary_stats import DeviceSpan, Timed, op_seconds
from tileship.serve.validate import BadRequest

if TYPE_CHECKING:
    from tileship.serve.app import Service
    from tileship.serve.holder import Served

#: ``encode(model=, version=, request_id=, parameters=, outputs=[(name, cpu tensor, binary)], allow_nonfinite=)``
Encoder = Callable[..., Any]


#: the parts of ``execute``'s time in the ``infer`` log line's ``spans`` (ms): tensors from the request (a CUDA
#: shared-memory window is lent here), the call's launch, waiting for the device, outputs to the
#: host, encoding (shared-memory outputs are written here); ``release_ms``: lent windows given back
SPANS = ("args_ms", "call_ms", "sync_ms", "host_ms", "encode_ms")

#: the status counted for a request its client cancelled (nginx's "client closed request")
CANCELLED = 499


class Fatal(Exception):
    """A sticky device error inside a call: the process is poisoned and exits."""


@dataclass
class Call:
    """An inference request as its transport hands it over."""

    name: str
    version: str | None
    request_id: str
    #: reads and parses the request: (request, bytes received); raises only BadRequest
    read: Callable[[], Awaitable[tuple[protocol.InferRequest, int]]]
    encode: Encoder
    #: the bytes of an encoded response (for the log line)
    size: Callable[[Any], int]
    protocol: str = "rest"
    #: told which release serves the request, once known (REST puts it in the response headers)
    on_served: Callable[[Served], None] | None = None
    #: the transport's bound on one answer's message (gRPC: protobuf's 2 GiB), checked with the output limit; None: none
    max_message_bytes: int | None = None


@dataclass
class Answer:
    """What ``run`` answered: ``status`` 200 with ``encoded``, or an error ``message``."""

    status: int
    encoded: Any = None
    decision: Decision | None = None
    served: Served | None = None
    message: str = ""
    diagnostics_id: str | None = None
    #: the BadRequest behind an error (its type says more than the status: ``extensions.ModelUnloaded``)
    error: BadRequest | None = None


async def run(service: Service, call: Call) -> Answer:
    """Answer ``call``; never raises (a bug is a 500 Answer, logged with its traceback)."""
    t0 = time.perf_counter()
    name, config = call.name, service.config
    served, side = service.canary.route(service.holder.current, name)
    labels = ["_unknown", "", "none"]
    kserve_id = None
    fut: Any = None
    req = None
    inline, inline_key = service.inline, None
    plan: call_plan.CallPlan | None = None
    encode: Any = None
    try:
        if served is None or service.holder.fatal is not None:
            raise BadRequest(503, f"not ready: {service.holder.readiness()[1]['reason']}")
        if call.on_served is not None:
            call.on_served(served)
        rel = served.release
        runner = rel.ops.get(name)
        whole = served.models.get(name)
        if runner is None and whole is None:
            raise BadRequest(404, f"unknown model {validate.short(name)}: this release serves "
                                  f"{', '.join(sorted([*rel.ops, *served.models]))}")
        labels[:2] = [name, rel.release_id]
        if call.version is not None and call.version != rel.release_id:
            raise BadRequest(404, f"unknown version {validate.short(call.version)} of model {name}: serving version "
                                  f"{rel.release_id}")
        if name in service.unloaded:
            raise extensions.ModelUnloaded(name, call.protocol, call.version)
        req, bytes_in = await call.read()
        kserve_id = req.id
        on_loop, inline_key = False, None
        if whole is not None:
            whole_plan = whole.plan(req)
            out_bytes = whole.output_bytes(whole_plan)
            validate.check_outputs(name, out_bytes, config.limits)  # before anything runs
        else:
            decl = rel.declarations[name]
            plan = service.plans.plan(req, name, decl)  # ``call_plan.plan_call``, kept per signature
            if not plan.declared and config.strict_shapes:
                dims = ", ".join(f"{d}={v}" for d, v in plan.dims.items())
                raise BadRequest(400, f"shape outside the declared set: {dims} (declared: "
                                      f"{validate.declared_shapes_text(decl)}); this server runs with --strict-shapes")
            validate.check_outputs(name, out_bytes := call_plan.output_bytes(decl, plan), config.limits)
            shm_requests.check_sizes(req, decl, plan, out_bytes)  # an output region of the wrong size: not run
        if call.max_message_bytes is not None:
            validate.check_message(name, out_bytes, req, call.max_message_bytes)
        # shared-memory inputs and outputs, only now: they skip the body limit, so no window is read before
        # the request passed every check its header allows (two 1 GiB inputs were read before a 413)
        encode = shm_requests.attach(service.shm, req, call.encode, service.staging)
        t_body = time.perf_counter()
        if whole is not None:
            job: Callable[[], Any] = functools.partial(execute_model, service, served, whole, whole_plan, req.id,
                                                       encode)
        else:
            assert plan is not None  # planned above
            on_loop = remote.on_loop(service, plan, out_bytes) and not req.timeout_us  # a deadline: a thread
            if inline is not None and remote.host_bytes(
                    plan, out_bytes, getattr(encode, "device_outputs", ())) <= remote.LOOP_BYTES:
                inline_key = inline.key(rel.release_id, name, plan)
            job = functools.partial(remote.execute_remote_async if on_loop else service.executor, service, served,
                                    name, plan, req.id, encode, **remote.keywords(service, req.timeout_us, out_bytes))
        t_submit = time.perf_counter()
        timed = Timed(job)
        if inline is not None and inline_key is not None and inline.fits(inline_key):
            way = "inline"
            encoded, decision = service.slots.run(timed)
        else:
            way = "loop" if on_loop else "thread"
            answered = asyncio.get_running_loop().create_future() if on_loop else None  # set by the task itself
            if on_loop:
                fut = service.slots.admit(functools.partial(timed.wrap, answered))
            else:
                fut = service.slots.submit(timed)
            try:
                encoded, decision = await handoff.outcome(fut, config.request_timeout_s, req.timeout_us * 1e-6,
                                                          answered)
            except TimeoutError as exc:  # past --timeout, or dropped unstarted past the request's own timeout
                service.metrics.rejected.labels("timeout").inc()
                service.slots.timed_out(fut)
                raise BadRequest(504, str(exc) or "timeout: the inference did not finish within "
                                                  f"{config.request_timeout_s:g} s") from None
        t_run = time.perf_counter()
        if inline is not None and inline_key is not None:
            inline.record(inline_key, timed.seconds, decision)
    except BadRequest as exc:
        service.canary.record(side, name, exc.status)
        service.count_error(exc.status, exc.message, call, labels, t0, kserve_id)
        return Answer(exc.status, served=served, message=exc.message, error=exc)
    except Fatal as exc:
        service.canary.record(side, name, 503, reason="device_failure")
        msg = f"device failure: {exc}; this process is exiting so its supervisor restarts it"
        service.count_error(503, msg, call, labels, t0, kserve_id)
        return Answer(503, served=served, message=msg)
    except asyncio.CancelledError:  # the client went away (a gRPC deadline or cancel): count it, then let it go
        if fut is not None:
            service.slots.timed_out(fut)  # a call still running keeps its slot and worker until it ends
        service.count_error(CANCELLED, "cancelled by the client before the answer", call, labels, t0, kserve_id)
        raise
    except Exception as exc:  # a bug: answer 500 with ids, never crash the server
        if inline is not None and inline_key is not None:
            inline.drop(inline_key)  # its next calls go to a thread again
        service.canary.record(side, name, 500)
        msg, diag = service.log_internal(call.request_id, exc, labels[0], served)
        service.count_error(500, msg, call, labels, t0, kserve_id)
        return Answer(500, served=served, message=msg, diagnostics_id=diag)
    finally:
        if req is not None and req.lease is not None:
            _give_back_after(req.lease, fut)
        if (leases := getattr(encode, "leases", None)) is not None:  # ``execute`` gives them back itself;
            _give_back_after(leases, fut)  # this covers every other executor (released once: idempotent)
    labels[2] = decision.path
    service.canary.record(side, name, 200, op_seconds(plan, timed.seconds), decision.reason)
    elapsed = time.perf_counter() - t0
    m = service.metrics
    m.answered(labels[0], labels[1], decision.path, elapsed)
    if decision.path == REFERENCE:
        m.fallbacks.labels(labels[0], labels[1], decision.reason).inc()
    service.log.event("infer", request_id=call.request_id, id=kserve_id, model=name, version=labels[1], status=200,
                      protocol=call.protocol, on=way, path=decision.path,
                      reason=decision.reason, spec=decision.spec_id,
                      ms=round(elapsed * 1e3, 3), body_ms=round((t_body - t0) * 1e3, 3),
                      run_ms=round((t_run - t_body) * 1e3, 3), bytes_in=bytes_in, bytes_out=call.size(encoded),
                      spans=plan.spans if plan is not None and plan.spans else None, shm=getattr(encode, "kinds", None))
    t_end = time.perf_counter()
    run_s = timed.seconds or 0.0
    service.stats.record(name, labels[1], True, t_end - t0, t_submit - t0, t_run - t_submit - run_s, run_s,
                         t_end - t_run)
    service.traces.answered(name, labels[1], call, kserve_id, t0, t_submit, timed, t_end)  # when sampled
    return Answer(200, encoded, decision, served)


def _own(out: Any, inputs: list[Any]) -> Any:
    """``out``, or a copy of it when it shares memory with an input (an input read from the request
    body, whose pooled block goes back to the pool before the response is sent)."""
    ptr = out.untyped_storage().data_ptr()
    for t in inputs:
        if hasattr(t, "untyped_storage") and t.device.type == "cpu" and t.untyped_storage().data_ptr() == ptr:
            return out.clone()
    return out


def _give_back_after(lease: Any, fut: Any) -> None:
    """Give a pooled body block (``give_back``) or borrowed CUDA windows (``release``) back once nothing
    reads them: now, or when the call still running on its worker thread (a 504 or a cancelled client) ends."""
    back = lease.give_back if hasattr(lease, "give_back") else lease.release
    if fut is None or fut.done():
        back()
    else:
        fut.add_done_callback(lambda _f: back())


def _fault(service: Service, served: Served, exc: Exception, device: str, call: Any = None) -> None:
    """Poison the process and raise Fatal when ``exc`` left the device unusable; else return."""
    if is_sticky_fault(exc, device):
        first = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        diag = service.capture(served, exc, call)
        service.poison(first + (f" (diagnostics {diag})" if diag else ""))
        raise Fatal(first) from exc


def parameters(served: Served, decision: Decision) -> dict[str, Any]:
    rel = served.release
    params = {"tileship_release": rel.release_id, "tileship_kernel_revision": rel.kernel_revision,
              "tileship_path": decision.path, "tileship_reason": decision.reason}
    if decision.spec_id:
        params["tileship_spec"] = decision.spec_id
    return params


def execute(service: Service, served: Served, name: str, plan: call_plan.CallPlan, kserve_id: str | None,
            encode: Encoder) -> tuple[Any, Decision]:
    """On a worker thread: tensors -> call -> sync -> CPU -> ``encode``. CallError is a 400."""
    rel = served.release
    runner = rel.ops[name]
    device = served.devices[name]
    leases = getattr(encode, "leases", None)  # CUDA shared-memory inputs read in place (``shm_requests.attach``)
    try:
        return _execute(service, served, name, plan, kserve_id, encode, runner, device)
    finally:
        if leases is not None:
            t0 = time.perf_counter()
            _release(leases, device)
            plan.spans["release_ms"] = round((time.perf_counter() - t0) * 1e3, 3)


def _release(leases: Any, device: str) -> None:
    """Give the lent windows back once the device is done with them; never after a sticky fault
    (the process exits: the windows stay mapped rather than be unmapped under a running kernel)."""
    if device != "cpu":
        import torch

        try:
            torch.cuda.current_stream().synchronize()
        except Exception:
            return
    leases.release()


def _execute(service: Service, served: Served, name: str, plan: call_plan.CallPlan, kserve_id: str | None,
             encode: Encoder, runner: Any, device: str) -> tuple[Any, Decision]:
    rel = served.release
    t = [time.perf_counter()]
    tensors = plan.arguments(device)
    t.append(time.perf_counter())
    span = DeviceSpan(device != "cpu" and service.canary.state == "running")
    try:
        out, decision = runner.call(*tensors, span=span) if span.on else runner.call(*tensors)
        t.append(time.perf_counter())
        decl = rel.declarations[name]
        declared = outputs_of(name, out, len(decl["outputs"]))  # () for an operator that only updates inputs in place
        check_declared(name, declared, decl, plan.dtype, plan.dims, inputs_device(tensors))
        out_names, outs = in_place.answered_names(decl), in_place.with_mutated(decl, declared, tensors)
        if device != "cpu":
            import torch

            torch.cuda.current_stream().synchronize()
            span.note(plan.spans)
        t.append(time.perf_counter())
        in_place.check_answer(name, out_names, outs, service.config.limits.max_output_bytes)
        on_device = getattr(encode, "device_outputs", ())  # bound for CUDA shared memory: no trip to the host
        host = [o if n in on_device else _own(o.detach().cpu(), tensors)
                for n, o in zip(out_names, outs, strict=True)]
    except CallError as exc:
        raise BadRequest(400, exc.message) from None
    except BadRequest:  # an answer past --max-output-mib: the device is fine
        raise
    except Exception as exc:
        _fault(service, served, exc, device, tensors)
        raise
    t.append(time.perf_counter())
    outputs = [(n, host[out_names.index(n)], binary) for n, binary in plan.outputs]
    encoded = encode(model=name, version=rel.release_id, request_id=kserve_id, parameters=parameters(served, decision),
                     outputs=outputs, allow_nonfinite=plan.allow_nonfinite)
    t.append(time.perf_counter())
    spans = plan.spans
    for i, key in enumerate(SPANS):
        spans[key] = round((t[i + 1] - t[i]) * 1e3, 3)
    return encoded, decision


def execute_model(service: Service, served: Served, whole: Any, plan: tuple[protocol.InputTensor, bool],
                  kserve_id: str | None, encode: Encoder) -> tuple[Any, Decision]:
    """On a worker thread: a whole model's forward (``examples/llama/serve.py``), errors as in ``execute``."""
    inp, binary = plan
    try:
        logits, decision, dispatch = whole.run(inp)
        if whole.device != "cpu":
            import torch

            torch.cuda.current_stream().synchronize()
        host = logits.detach().cpu()
    except CallError as exc:
        raise BadRequest(400, exc.message) from None
    except Exception as exc:
        _fault(service, served, exc, whole.device)
        raise
    encoded = encode(model=whole.spec.name, version=served.release_id, request_id=kserve_id,
                     parameters={**parameters(served, decision), **dispatch}, outputs=[(whole.output, host, binary)])
    return encoded, decision
