"""Triton's request parameters ``timeout`` and ``priority`` (tritonclient's ``infer(..., timeout=, priority=)``):
read and checked here for REST and gRPC alike, and what tileship does with them.

- ``timeout``: microseconds the request may wait for a worker once admitted, as Triton's bounds the time a
  request waits in its scheduler's queue; 0 (or absent) is no limit, as in Triton. tileship's queue is the
  wait between admission and a request thread starting the call (``handoff.outcome``): a request still
  waiting when its timeout passes is dropped there, never run, answered 504 / DEADLINE_EXCEEDED naming the
  parameter, and counted as ``tileship_rejected_total{reason="timeout"}``, as a request past ``--timeout`` is.
  A call that has started runs on under ``--timeout`` alone (Triton does not stop a running execution
  either). The body read, parsing and checks before admission do not count; a call run inline on the event
  loop (``handoff.Inline``) never waits; with ``--workers N`` a request with a timeout takes a request
  thread even when small (``remote.on_loop``'s loop calls wait for a worker process where nothing could
  drop them), and the deadline also bounds the thread's wait for an idle worker process
  (``pool_calls.PoolCalls.call``): past it the request is answered the same way and never reaches a worker.
- ``priority``: Triton's priority level (1 the highest; 0 the model's default). Checked, and otherwise
  ignored: tileship's queue is first come, first served (one ``ThreadPoolExecutor`` queue), and reordering it
  would need a queue of its own.

Triton's gRPC server takes ``int64_param`` or ``uint64_param``; a REST request sends a JSON integer. A boolean,
a string, a float or a null is refused, as is a value outside the range (``timeout`` int64, ``priority``
uint64, as Triton's): ``read`` raises only ``BadRequest`` (400 / INVALID_ARGUMENT) naming the parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tileship.serve.validate import BadRequest, short

#: the largest value each parameter takes (Triton's types) and what it means, for the error message
RANGES = {"timeout": ((1 << 63) - 1, "microseconds the request may wait for a worker; 0: no limit"),
          "priority": ((1 << 64) - 1, "Triton's priority level; 0: the default")}


def read(params: Mapping[str, Any]) -> tuple[int, int]:
    """(timeout in microseconds, priority) of a request's ``parameters`` as plain values (REST's JSON object,
    gRPC's ``InferParameter`` map read as values); (0, 0) when absent. Raises only ``BadRequest`` (400)."""
    return _uint(params, "timeout"), _uint(params, "priority")


def _uint(params: Mapping[str, Any], key: str) -> int:
    if key not in params:
        return 0
    v = params[key]
    most, meaning = RANGES[key]
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= most:
        got = short(v) if type(v) is int else f"{type(v).__name__} {short(v)}"
        raise BadRequest(400, f"parameters.{key} must be an integer in 0..{most} ({meaning}), got {got}")
    return v
