"""The pointer a server served, kept across restarts: ``tileship serve --generation-state FILE``.

A server that trusts activator keys (``pointer_seal``) refuses a pointer older than the one it serves; with
this file (``TILESHIP_POINTER_STATE``; a Ray fleet's controller keeps one too) a restarted server does as well,
and refuses a registry whose id changed (the file keeps the registry id served). ``write_served`` replaces the
file whole after each pointer accepted; ``read_served`` refuses anything it did not write.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from tileship.errors import PointerSignatureError
from tileship.release import bundle, small_file, strict_json
from tileship.release import registry_id as regid
from tileship.release.pointer_seal import Sealed
from tileship.release.records import KEY_ID

#: the most of a ``--generation-state`` file read (``write_served`` writes about a hundred bytes)
STATE_READ_LIMIT = 4096
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def read_served(path: Path | None) -> Sealed | None:
    """The pointer a server served last, as ``write_served`` left it in ``path``; None when ``path`` is None
    or does not exist yet (a first start). Raises PointerSignatureError naming ``path`` when it is unreadable
    or not such a record: it is only ever written whole, so anything else was not written by a server. A FIFO or
    a device is refused without blocking on it, a file over ``STATE_READ_LIMIT`` bytes without reading it whole."""
    if path is None:
        return None
    data: Any
    try:
        data = strict_json.loads(small_file.read(Path(path), STATE_READ_LIMIT), path, error=PointerSignatureError)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a directory, a FIFO, unreadable, too large
        data = exc.strerror or exc
    except PointerSignatureError as exc:  # not strict JSON
        data = exc.message
    gen = data.get("generation") if isinstance(data, dict) else None
    kid = data.get("key_id") if isinstance(data, dict) else None
    digest = data.get("digest") if isinstance(data, dict) else None
    bound = data.get("registry_id") if isinstance(data, dict) else None  # absent in a record from before ids
    if not (type(gen) is int and 0 <= gen < 10**18 and isinstance(kid, str) and KEY_ID.fullmatch(kid)
            and isinstance(digest, str) and DIGEST.fullmatch(digest)
            and (bound is None or (isinstance(bound, str) and regid.ID.fullmatch(bound)))):
        why = "not a served-pointer record" if isinstance(data, dict) else f"unreadable ({data})"
        raise PointerSignatureError(f"{path}: the generation state is {why}", path=str(path),
                                    hint="restore it, or remove it to trust the registry's current pointer once "
                                         "(as a first start does)")
    return Sealed(gen, kid, digest, bound)


def write_served(path: Path, sealed: Sealed) -> None:
    """Record ``sealed`` as the pointer served, atomically: a temporary beside ``path``, fsynced, renamed over it
    (``inplace.write_atomic``), then the directory fsynced; killed at any instant, ``path`` holds the old record
    or the new one. Raises OSError when it cannot be written."""
    path = Path(path)
    record = {"generation": sealed.generation, "key_id": sealed.key_id, "digest": sealed.digest}
    bundle.write_json_atomic(path, record | ({"registry_id": sealed.registry_id} if sealed.registry_id else {}))
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
