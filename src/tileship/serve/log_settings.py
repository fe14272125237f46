"""Triton's logging extension: read and change which events the server's log writes (issue 15, item 6).

    GET  /v2/logging    the settings now (Triton's JSON object)
    POST /v2/logging    change some of them; answers the settings after the change
    gRPC LogSettings    the same (an empty request reads them)

The settings filter ``JsonLog`` (``serve.jsonlog``), the server's one stream of JSON lines, by
level: ``log_info``, ``log_warning`` and ``log_error`` turn those levels on and off;
``log_verbose_level`` > 0 lets ``debug`` events through. ``critical`` lines (a fatal device
error) are always written. uvicorn's own messages keep ``--log-level``.

``log_file`` and ``log_format`` are reported, and may be sent with the values they have (a
client may post back what it read), but tileship does not change them: the log goes to
stderr (or the stream the server was started with) as JSON lines; redirect stderr to keep a
file. Sending another value is a 400 naming the field, as is an unknown field, a value of
the wrong type (``true`` for an integer, ``1`` for a boolean, ``null``), a verbose level
outside 0..2**32-1 (Triton's uint32) and a field given twice. A request is checked whole before anything changes.

Contract: ``update`` raises only ``BadRequest`` (400); ``endpoint`` answers 4xx for any body.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import orjson

from tileship.release import strict_json
from tileship.serve.validate import BadRequest, short

if TYPE_CHECKING:  # JsonLog imports this module: the web framework only where a route runs
    from starlette.requests import Request
    from starlette.responses import Response

#: the format tileship writes; Triton's ``default`` is accepted as a name for it
FORMAT = "json"
MAX_VERBOSE = (1 << 32) - 1

_BOOLS = {"log_info": "info", "log_warning": "warning", "log_error": "error"}
FIELDS = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")


class LogSettings:
    """Which levels ``JsonLog`` writes. Read from any thread; changed whole under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._on = {"info": True, "warning": True, "error": True}
        self.verbose = 0

    def allows(self, level: str) -> bool:
        """Whether a line at ``level`` is written: ``debug`` only with a verbose level, unknown levels always."""
        if level == "debug":
            return self.verbose > 0
        return self._on.get(level, True)

    def to_json(self) -> dict[str, Any]:
        """Triton's settings object."""
        return {"log_file": "", "log_info": self._on["info"], "log_warning": self._on["warning"],
                "log_error": self._on["error"], "log_verbose_level": self.verbose, "log_format": FORMAT}

    def update(self, doc: Any) -> dict[str, Any]:
        """Apply the fields of ``doc`` (a dict; values already decoded); returns the fields that changed,
        with their new values. Raises BadRequest(400) naming the first field that is wrong; then nothing changed."""
        if not isinstance(doc, dict):
            raise BadRequest(400, f"the logging settings must be a JSON object with some of {', '.join(FIELDS)}")
        new_on, verbose = dict(self._on), self.verbose
        for key, value in doc.items():
            if key in _BOOLS:
                if not isinstance(value, bool):
                    raise BadRequest(400, f"{key} must be true or false, not {short(value)}")
                new_on[_BOOLS[key]] = value
            elif key == "log_verbose_level":
                if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_VERBOSE:
                    raise BadRequest(400, f"log_verbose_level must be an integer from 0 to {MAX_VERBOSE}, "
                                          f"not {short(value)}")
                verbose = value
            elif key == "log_file":
                if value != "":
                    raise BadRequest(400, f"log_file {short(value)} is not supported: tileship serve writes its log "
                                          "to stderr; redirect stderr to keep a file (log_file \"\" is accepted)")
            elif key == "log_format":
                if value not in (FORMAT, "default"):
                    raise BadRequest(400, f"log_format {short(value)} is not supported: tileship serve writes JSON "
                                          f"lines (log_format \"{FORMAT}\" or \"default\" is accepted)")
            else:
                raise BadRequest(400, f"unknown logging setting {short(key)}: the settings are {', '.join(FIELDS)}")
        with self._lock:
            before = self.to_json()
            self._on, self.verbose = new_on, verbose
            after = self.to_json()
        return {k: v for k, v in after.items() if before[k] != v}


def _decode(raw: bytes) -> Any:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:  # also integers past 64 bits
        raise BadRequest(400, f"the logging settings must be a JSON object: malformed JSON "
                              f"({short(str(exc))})") from None
    twice = strict_json.duplicate_key(raw, doc)
    if twice:  # orjson takes the last of two equal keys: a body that says two things is refused
        raise BadRequest(400, f"the logging settings are refused: {twice}")
    return doc


def apply(service: Any, doc: Any) -> dict[str, Any]:
    """Change the settings of ``service``'s log (``LogSettings.update``), log the change (always:
    the line that says why the log went quiet), and return the settings after it. Raises only BadRequest."""
    changed = service.log.settings.update(doc)
    if changed:
        service.log.event("log_settings", always=True, **changed)
    return service.log.settings.to_json()  # type: ignore[no-any-return]


async def endpoint(request: Request) -> Response:
    """``GET``/``POST /v2/logging``: 200 with the settings, 4xx ``{"error": ...}`` for a body that is wrong."""
    from starlette.responses import JSONResponse

    from tileship.serve.body import control_body

    service = request.app.state.service
    if request.method == "GET":
        return JSONResponse(service.log.settings.to_json())
    try:
        raw = await control_body(request)
        return JSONResponse(apply(service, _decode(bytes(raw))))
    except BadRequest as exc:
        return JSONResponse({"error": exc.message}, status_code=exc.status)
