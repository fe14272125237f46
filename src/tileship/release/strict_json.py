"""Parsing the JSON files of a release (and the registry's) as hostile input.

``json.loads`` alone lets a crafted file through as a traceback, never as an error that names
it: a number of more than 4300 digits raises a bare ValueError, nesting deeper than the
interpreter's stack a RecursionError. And it takes the last of two equal keys, so one file
could mean two things to two readers (a manifest whose ``files`` is listed twice). ``loads``
refuses all of these with the caller's error, naming the file and what is wrong. tileship
never writes a duplicate key (its files are dumped from dicts), so nothing it wrote is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tileship.errors import BundleError, BundleIntegrityError, TileshipError

#: the most bytes ``read`` takes from one file (a release's largest JSON, its manifest, is megabytes)
READ_LIMIT = 64 << 20


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key[:80]!r} appears twice in one object")
        out[key] = value
    return out


def duplicate_key(body: bytes | str, parsed: Any) -> str | None:
    """Why ``body``, already parsed (by any reader) into ``parsed``, holds a key twice in one object
    (``key 'k' appears twice in one object``), or None. Every key in the text is followed by a ``:``, so
    a body with no more colons than ``parsed`` has keys has none twice: only other bodies are parsed
    again, here with ``_no_duplicates``."""
    keys, stack = 0, [parsed]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            keys += len(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    if (body.count(b":") if isinstance(body, bytes) else body.count(":")) <= keys:
        return None
    try:
        json.loads(body, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        return str(exc)
    except (ValueError, RecursionError):  # the caller's reader accepted it: not this reader's to refuse
        pass
    return None


def loads(body: bytes | str, path: Path | str, what: str = "",
          error: type[TileshipError] = BundleIntegrityError) -> Any:
    """``body`` (the contents of ``path``) parsed as JSON. Never raises anything but ``error``
    (``path=`` is passed to it when it is a BundleError): invalid UTF-8 or JSON, a duplicate key,
    an integer too long to convert, nesting too deep to parse. ``what`` names the file's role in the
    message (``<path>: <what> is not valid JSON (...)``)."""
    try:
        return json.loads(body, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        why = str(exc)
    except RecursionError:
        why = "nested too deeply"
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the integer digit limit
        why = str(exc)[:300]
    message = f"{path}: {what + ' is ' if what else ''}not valid JSON ({why})"
    if issubclass(error, BundleError):
        raise error(message, path=str(path))
    raise error(message)


def read(path: Path, what: str = "", error: type[TileshipError] = BundleIntegrityError, limit: int = READ_LIMIT) -> Any:
    """The JSON file at ``path`` read as hostile input (``small_file.read``: a regular file of at most ``limit``
    bytes, never blocking on a FIFO nor reading without end from a device) and parsed by ``loads``. Raises
    FileNotFoundError when there is none, else only ``error`` naming the file."""
    from tileship.release import small_file

    try:
        body = small_file.read(Path(path), limit)
    except FileNotFoundError:
        raise
    except OSError as exc:
        message = f"{path}: cannot read {what or 'the file'}: {exc.strerror or exc}"
        raise (error(message, path=str(path)) if issubclass(error, BundleError) else error(message)) from None
    return loads(body, path, what, error)
