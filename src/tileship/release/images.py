"""The container image a published release ships in, recorded by ``tileship publish --image-digest``.

An image built by ``tileship image`` holds its release, so the image's digest exists only after the
release does: it cannot go into the release's lock (the lock is an identity file: the release id
would change, and the image would hold another release). ``tileship lock --image-digest`` pins an
image known before the build (a base the release is mounted into); an image built from the release
is recorded next to it in the registry instead, leaving the release byte-identical (same id, same
manifest, its signature intact)::

    <registry>/images/<release id>.json    {"image_digest": "sha256:<64 hex>", "release_id": ...}

``pinned(release_dir, lock)`` is the digest a server compares with the one it runs in
(``TILESHIP_IMAGE_DIGEST``): the registry's record when the release was loaded from a registry
that holds one, else the lock's ``image_digest``. Nothing here imports torch or TileLang.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tileship.build.lock import IMAGE_DIGEST
from tileship.errors import BundleError, RegistryError
from tileship.release import strict_json

IMAGES = "images"
_COPY = re.compile(r"^([0-9a-f]{16})(@\d+)?$")  # releases/<id>[@n] (registry.py's layout)


def check_digest(digest: str) -> str:
    """``digest`` when it is ``sha256:<64 hex>``. Raises RegistryError otherwise."""
    if not IMAGE_DIGEST.fullmatch(digest):
        raise RegistryError(f"image digest {digest!r} is not sha256:<64 hex>",
                            hint="pass the digest your container registry returned on push, e.g. sha256:3f5...")
    return digest


def record(registry_root: Path, release_id: str, digest: str) -> Path:
    """Write the record of ``release_id`` (atomically; replaces an earlier one). Returns its path.
    The caller holds the registry's lock."""
    from tileship.release.bundle import write_json_atomic

    path = Path(registry_root) / IMAGES / f"{release_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"image_digest": check_digest(digest), "release_id": release_id})
    return path


def recorded(registry_root: Path, release_id: str) -> str | None:
    """The image digest recorded for ``release_id``; None when there is none or it is unreadable."""
    try:
        path = Path(registry_root) / IMAGES / f"{release_id}.json"
        data = strict_json.loads(path.read_bytes(), path)
    except (OSError, BundleError):
        return None
    digest = data.get("image_digest") if isinstance(data, dict) else None
    return digest if isinstance(digest, str) and IMAGE_DIGEST.fullmatch(digest) else None


def pinned(release_dir: Any, lock: Mapping[str, Any] | None) -> str | None:
    """The image a release is meant to run in: the registry's record when ``release_dir`` is a
    published copy (``<registry>/releases/<id>[@n]``) with one, else the lock's ``image_digest``."""
    if release_dir is not None:
        path = Path(release_dir)
        m = _COPY.match(path.name)
        if m and path.parent.name == "releases":
            digest = recorded(path.parent.parent, m.group(1))
            if digest is not None:
                return digest
    value = (lock or {}).get("image_digest")
    return str(value) if value else None
