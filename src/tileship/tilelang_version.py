"""The TileLang releases tileship supports, and the check that the installed one is among them.

tileship reaches below TileLang's public API: it dlopens the runtime library shipped in the
TileLang wheel (``runtime.artifact``), reads the files its compiler writes (``build.worker``) and
patches its compile entry points (``runtime.nojit``). Those internals change between TileLang
releases, so the supported range is narrow: the releases the test suite has passed on.

``SUPPORTED`` is the same specifier as ``pyproject.toml``'s ``tilelang`` requirement (a test keeps
them equal); ``constraints.txt`` pins the tested release inside it. The modules that need TileLang
call ``check()`` when they are imported (``runtime.artifact``, ``build.worker``), so an unsupported
TileLang fails there with ``UnsupportedTileLang`` naming both versions, instead of as an
``AttributeError`` deep inside a load or a build. Modules that only read versions (``build.lock``,
``tileship check``) do not check: they report a TileLang other than the lock's as drift, and a
release under the fallback policy then serves its references without importing TileLang at all.
Reading the version imports nothing of TileLang (package metadata only).
"""

from __future__ import annotations

import re
from importlib import metadata

from tileship.errors import UnsupportedTileLang

#: the ``tilelang`` requirement of pyproject.toml (lower bound inclusive, upper bound exclusive)
SUPPORTED = ">=0.1.15,<0.1.16"
_LOW, _HIGH = (0, 1, 15), (0, 1, 16)


def installed() -> str | None:
    """The installed TileLang's version (distribution metadata), or None when it is not installed."""
    try:
        return metadata.version("tilelang")
    except metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...] | None:
    """The numeric release part of a version (``0.1.15.post1+cu130`` -> (0, 1, 15)); None if unparsable.
    A pre-release (``0.1.16rc1``) counts as its release: inside [low, high) only if its release is."""
    m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def is_supported(version: str) -> bool:
    release = _release(version)
    return release is not None and _LOW <= release < _HIGH


def check(version: str | None = None) -> str:
    """The installed (or given) TileLang version when it is inside ``SUPPORTED``.

    Raises UnsupportedTileLang naming the installed and the supported versions (or saying that
    TileLang is not installed)."""
    found = installed() if version is None else version
    if found is None:
        raise UnsupportedTileLang("TileLang is not installed; tileship needs tilelang" + SUPPORTED,
                                  installed=None, supported=SUPPORTED,
                                  hint=f"pip install 'tilelang{SUPPORTED}' (constraints.txt pins the tested release)")
    if not is_supported(found):
        raise UnsupportedTileLang(f"TileLang {found} is installed; tileship supports tilelang{SUPPORTED}",
                                  installed=found, supported=SUPPORTED,
                                  hint=f"pip install 'tilelang{SUPPORTED}' (constraints.txt pins the tested release), "
                                       "or use a tileship release that supports TileLang " + found)
    return found
