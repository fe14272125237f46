"""Triton's trace extension: trace settings, global and per model, and the traces they ask for.

    GET  /v2/trace/setting, /v2/models/{m}/trace/setting    the settings in effect (global; the model's)
    POST the same                                           change some; answers the settings after the change
    gRPC TraceSetting                                       the same (a request without settings reads them)

The settings, by Triton's names (each value a string, ``trace_level`` a list of strings):

    trace_level    ["OFF"] (default), or ["TIMESTAMPS"]: trace the sampled requests' timestamps. "TENSORS"
                   (the tensors' contents) is refused: tileship does not trace them
    trace_rate     "1000": a model's rate-th, 2*rate-th, ... answered request is traced, counted per model
                   from the last change of the settings that apply to it
    trace_count    "-1": the traces still to write (-1: no limit); each trace takes one from where the count
                   was set (the model's own, else the global); at "0" tracing stops
    log_frequency  "0": kept and returned, and changes nothing: each trace is written when its request is
                   answered, as one line of the server's log
    trace_file     "" and trace_mode "triton": read only (traces go to the server's log; Triton does not let
                   the trace file change over the network either); sending the value they have is accepted

A model's settings are those it set itself, over the global ones for the rest (following later global changes).
A ``null`` (REST) or an empty value list (gRPC) clears a setting: a global one goes back to its default, a model's
to following the global one. A request is checked whole before anything changes; an unknown setting, a value
of the wrong type or out of range, or a read-only setting changed is a 400 / INVALID_ARGUMENT naming it.

A trace is one JSON log line (``serve.jsonlog``), written whatever the logging extension lets through:
``{"event": "trace", "trace_id", "model_name", "model_version", "request_id", "id", "protocol", "timestamps"}``
with ``request_id`` the server's (as on the request's ``infer`` line), ``id`` the request's own, and Triton's
timestamp names in order: REQUEST_START (received), QUEUE_START (admitted), COMPUTE_START and COMPUTE_END (the
call on its worker), REQUEST_END (answered), each ``{"name", "ns"}`` on the monotonic clock (``time.perf_counter``:
CLOCK_MONOTONIC on Linux, as Triton's steady clock). Only answered (200) inference requests are traced.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tileship.digits import parse_uint
from tileship.serve.validate import BadRequest, short

DEFAULTS: Mapping[str, str | list[str]] = {"trace_file": "", "trace_level": ["OFF"], "trace_rate": "1000",
                                          "trace_count": "-1", "log_frequency": "0", "trace_mode": "triton"}
#: the least value of each numeric setting
LEAST = {"trace_rate": 1, "trace_count": -1, "log_frequency": 0}
LEVELS = ("OFF", "TIMESTAMPS")
STAMPS = ("REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END")


class Traces:
    """The settings and the sampling counts. Used on the event loop only (plain dicts, no locks)."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self.own: dict[str | None, dict[str, Any]] = {None: {}}  # values set: globally (None), per model
        self.seen: dict[str, int] = {}  # answered requests per model since its settings last changed
        self.on = False  # whether any level traces: the request path's fast check
        self.written = 0

    def settings(self, model: str | None = None) -> dict[str, Any]:
        """The settings in effect, globally (``model`` None) or for ``model``, as Triton's JSON object."""
        out = {**DEFAULTS, **self.own[None], **(self.own.get(model, {}) if model is not None else {})}
        return {k: list(v) if isinstance(v, list) else v for k, v in out.items()}

    def update(self, model: str | None, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` (a setting -> its value, None to clear) globally or to ``model``; the settings
        after. Raises only ``BadRequest`` (400), before anything changes."""
        checked = {k: self._check(k, v) for k, v in changes.items()}
        own = self.own.setdefault(model, {})
        for k, v in checked.items():
            if v is None or k in ("trace_file", "trace_mode"):
                own.pop(k, None)
            else:
                own[k] = v
        if model is not None and not own:
            del self.own[model]
        if checked and model is None:
            self.seen.clear()
        elif checked and model is not None:
            self.seen.pop(model, None)
        self.on = any("TIMESTAMPS" in o.get("trace_level", ()) for o in self.own.values())
        return self.settings(model)

    @staticmethod
    def _check(key: str, value: Any) -> Any:
        if key not in DEFAULTS:
            raise BadRequest(400, f"unknown trace setting {short(key)}: the settings are {', '.join(DEFAULTS)}")
        if value is None:
            return None
        if key == "trace_level":
            levels = value
            if not isinstance(levels, list) or not levels or not all(isinstance(v, str) for v in levels):
                raise BadRequest(400, f"trace_level must be a non-empty list of strings, got {short(value)}")
            if "TENSORS" in levels:
                raise BadRequest(400, "trace_level TENSORS is not supported: tileship traces TIMESTAMPS only")
            if bad := [v for v in levels if v not in LEVELS]:
                raise BadRequest(400, f"unknown trace_level {short(bad[0])}: the levels are {', '.join(LEVELS)}")
            return sorted(set(levels), key=LEVELS.index)
        if key in ("trace_file", "trace_mode"):
            if value != DEFAULTS[key]:
                why = "tileship writes traces to its log" if key == "trace_file" else "tileship traces as Triton does"
                raise BadRequest(400, f"{key} cannot be changed ({why}): it is {DEFAULTS[key]!r}, got {short(value)}")
            return value
        n = -1 if value == "-1" else parse_uint(value)  # a string of at most 18 ASCII digits, as Triton's are strings
        if n is None or n < LEAST[key]:
            raise BadRequest(400, f"{key} must be an integer of at least {LEAST[key]} written as a string, got "
                                  f"{short(value)}")
        return str(n)

    def answered(self, name: str, version: str, call: Any, kserve_id: str | None, t0: float, t_submit: float,
                 timed: Any, t_end: float) -> None:
        """An answered (200) request of ``name``, received at ``t0``, admitted at ``t_submit``, its call
        ``timed`` (``canary_stats.Timed``), answered at ``t_end``: written as a trace when the settings sample it."""
        if not self.on:
            return
        s = self.settings(name)
        if "TIMESTAMPS" not in s["trace_level"]:
            return
        n = self.seen[name] = self.seen.get(name, 0) + 1
        count = int(s["trace_count"])
        if n % int(s["trace_rate"]) or count == 0:
            return
        if count > 0:  # taken from where it was set
            self.own[name if "trace_count" in self.own.get(name, {}) else None]["trace_count"] = str(count - 1)
        start = timed.started if timed.started is not None else t_submit
        at = (t0, t_submit, start, start + (timed.seconds or 0.0), t_end)
        self.written += 1
        self.log.event("trace", always=True, trace_id=self.written, model_name=name, model_version=version,
                       request_id=call.request_id, id=kserve_id, protocol=call.protocol,
                       timestamps=[{"name": k, "ns": int(t * 1e9)} for k, t in zip(STAMPS, at, strict=True)])


def grpc_changes(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A ``TraceSettingRequest``'s settings as ``Traces.update`` takes them (REST's form): an empty value list
    clears; one value of a setting other than ``trace_level`` is that value (more stay a list, refused)."""
    out: dict[str, Any] = {}
    for k, v in settings.items():
        values = list(v.value)
        out[k] = None if not values else values[0] if k != "trace_level" and len(values) == 1 else values
    return out


async def endpoint(request: Any) -> Any:
    """GET/POST ``/v2[/models/{m}]/trace/setting``: 400 for a body that is not a JSON object of settings, 404 an
    unknown model, 503 while no release is loaded (a model's settings only)."""
    import orjson
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse

    from tileship.serve import extensions

    service = request.app.state.service
    name = request.path_params.get("name")
    if name is not None:
        extensions.known(extensions.served(service), name)
    if request.method == "GET":
        return JSONResponse(service.traces.settings(name))
    raw = await extensions.read_body(request)
    try:
        body = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        raise HTTPException(400, "the trace settings must be a JSON object of settings, e.g. "
                                 '{"trace_level": ["TIMESTAMPS"], "trace_rate": "100"}')
    try:
        return JSONResponse(service.traces.update(name, body))
    except BadRequest as exc:
        raise HTTPException(exc.status, exc.message) from None
