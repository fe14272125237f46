"""A registry's identity: a random id, written once, that every pointer it writes carries under its seal.

``registry.json`` in the registry root holds ``{"registry_id": <32 hex digits>, "since_generation": G}``. It is
written by the first pointer write of a tileship that knows registry ids (``ensure``, under the registry's lock,
before that pointer: a new registry's first ``activate``, an existing registry's first change after an upgrade),
and never rewritten: ``G`` is the generation of that first pointer. Publishing alone writes no id, so a registry
whose pointer was sealed before ids keeps being served until its pointer is next written.

Written once, atomically, by the first writer only: the id goes to a temporary ``registry.json.tmp<pid>-<random>``
(``inplace.stage``), fsynced, which is then *linked* to ``registry.json`` (``os.link`` never replaces a file: a
second writer that raced past the lock finds it there and takes the id it holds), then the directory is fsynced. A
writer killed at any instant leaves no ``registry.json`` or a whole one, and perhaps the temporary, which the next
change's ``gc`` removes. Where the filesystem cannot link, the temporary is renamed into place under the lock.

The id binds pointers to the registry (``pointer_seal.check``); the file itself is as writable as the pointer,
so a reader that has served a pointer also remembers the id it was bound to (``pointer_seal.Sealed``), and a reader
may be told the id to trust before it sees any pointer (``trusted``: ``serve --trusted-registry-id``,
``TILESHIP_TRUSTED_REGISTRY_ID``), which removes the trust on first use of the id.
"""

from __future__ import annotations

import errno
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from tileship.errors import BundleError, RegistryError, TileshipError
from tileship.release import inplace, nofollow, strict_json
from tileship.release.records import REGISTRY_ID

NAME = "registry.json"
#: what a registry id is (and what a pointer's ``registry_id`` must be: ``records.REGISTRY_ID``)
ID = REGISTRY_ID
#: the most of ``registry.json`` read (it is about 80 bytes)
READ_LIMIT = 4096
_NO_LINK = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS)


@dataclass(frozen=True)
class Identity:
    """A registry's id, and the generation of the first pointer that carried it (``since``)."""

    registry_id: str
    since: int


def read(root: Path, error: type[TileshipError] = RegistryError) -> Identity | None:
    """The identity of the registry at ``root``; None when it has none (never written by a tileship that knows
    ids). Raises ``error`` naming the file when it is there but not one (read as hostile input: never blocking on
    a FIFO, at most ``READ_LIMIT`` bytes)."""
    path = Path(root) / NAME
    try:
        data = strict_json.read(path, "the registry id", error, READ_LIMIT)
    except FileNotFoundError:
        return None
    rid = data.get("registry_id") if isinstance(data, dict) else None
    since = data.get("since_generation") if isinstance(data, dict) else None
    if not (isinstance(rid, str) and ID.fullmatch(rid) and type(since) is int and 0 <= since < 10**18):
        message = f"{path}: not a registry id (registry_id: 32 hex digits, since_generation: a whole number)"
        hint = ("it is written once and never changed: restore it (the pointers' registry_id names it); removing it "
                "gives the registry a new identity, which servers that served its pointers refuse")
        if issubclass(error, BundleError):
            raise error(message, path=str(path), hint=hint)
        raise error(message, hint=hint)
    return Identity(rid, since)


def trusted(given: str | None) -> str | None:
    """The registry id a reader requires pointers to be bound to (``pointer_seal.check(registry=)``): ``given``,
    else ``TILESHIP_TRUSTED_REGISTRY_ID``; None: none (the registry's own, trusted on first use). Raises RegistryError
    naming the source when it is not 32 hex digits."""
    from tileship import env

    value, source = (given, "--trusted-registry-id") if given is not None else (
        env.trusted_registry_id(), "TILESHIP_TRUSTED_REGISTRY_ID")
    if value is not None and not ID.fullmatch(value):
        raise RegistryError(f"{source} {value[:80]!r}: not a registry id (32 hex digits)",
                            hint=f"the registry_id in the registry's {NAME} (`tileship releases` shows it)")
    return value


def ensure(root: Path, since: int) -> Identity:
    """The registry's identity, written now (with ``since``: the generation of the pointer about to be written) when
    it has none. The caller holds the registry's lock. Raises RegistryError for an unreadable or unwritable id."""
    root = Path(root)
    if (have := read(root)) is not None:
        return have
    path = root / NAME
    body = json.dumps({"registry_id": uuid.uuid4().hex, "since_generation": since}, sort_keys=True) + "\n"
    tmp: Path | None = None
    try:
        tmp = inplace.stage(path, body.encode())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another writer's id came first: it is the registry's
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise
            os.replace(tmp, path)  # no hard links here: under the lock, nobody else writes it
        nofollow.fsync_dir(root)
    except OSError as exc:
        cause = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else exc.strerror
        raise RegistryError(f"{path}: the registry id cannot be written ({cause}); the pointer is unchanged",
                            hint="free space on the registry's filesystem and try again") from None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    ident = read(root)
    assert ident is not None
    return ident
