"""Structured logs: one JSON object per line, one line per event.

Every line has ``ts`` (unix seconds), ``level`` and ``event``; request lines add
``request_id`` (the client's ``x-request-id`` when it sent one). uvicorn's own messages go
through ``UvicornJsonFormatter`` so the whole stream parses line by line. Which levels are
written is ``JsonLog.settings`` (``serve.log_settings``: Triton's logging extension).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any, TextIO

import orjson

from tileship.serve.log_settings import LogSettings

_ORJSON_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE
#: a string field longer than this is cut in the line (a client's request ``id`` may be megabytes)
FIELD_CHARS = 1024


def clipped(value: str) -> str:
    """``value`` when it has at most ``FIELD_CHARS`` characters, else its head and how much was cut."""
    if len(value) <= FIELD_CHARS:
        return value
    return f"{value[:FIELD_CHARS]}...(+{len(value) - FIELD_CHARS} chars)"


def line_of(record: dict[str, Any]) -> str:
    """``record`` as one compact JSON line: orjson (one line per served request, so it is on the
    hot path), and the standard library for what orjson refuses (an integer past 64 bits)."""
    try:
        return orjson.dumps(record, default=str, option=_ORJSON_OPTS).decode()
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(record, default=str, separators=(",", ":")) + "\n"


class JsonLog:
    """Thread-safe writer of JSON lines to ``stream`` (default: stderr), of the levels ``settings`` allows."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self.settings = LogSettings()

    def event(self, event: str, level: str = "info", *, always: bool = False, **fields: Any) -> None:
        """One line, when ``settings`` allows ``level`` or ``always`` (a change of the settings themselves).
        String fields but ``traceback`` are cut to ``FIELD_CHARS`` characters (``clipped``), so a client's
        long request id or model name costs the log a bounded line."""
        if not (always or self.settings.allows(level)):
            return
        for key, value in fields.items():
            if key != "traceback" and isinstance(value, str) and len(value) > FIELD_CHARS:
                fields[key] = clipped(value)
        record = {"ts": round(time.time(), 6), "level": level, "event": event, **fields}
        line = line_of(record)
        stream = self._stream or sys.stderr
        with self._lock:
            stream.write(line)
            stream.flush()


class UvicornJsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 6), "level": record.levelname.lower(), "event": "uvicorn",
               "message": record.getMessage()}
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"))


def uvicorn_log_config(level: str = "warning") -> dict[str, Any]:
    """uvicorn's logging as JSON lines on stderr; its access log is off (requests log themselves)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.UvicornJsonFormatter"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
        "loggers": {"uvicorn": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
                    "uvicorn.error": {"level": level.upper()},
                    "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False}},
    }
