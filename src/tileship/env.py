"""Environment variables, read in one place into typed values.

Precedence everywhere: command-line flag > environment variable > project file > default.

    TILESHIP_HOME           where registries and work files live (default: ./.tileship)
    TILESHIP_TRUSTED_KEYS   os.pathsep-separated ed25519 public keys (PEM); when set, loading
                            requires a signature by one of them
    TILESHIP_TRUSTED_VERIFIER_KEYS  os.pathsep-separated ed25519 public keys (PEM) of the verifier
                            role (``tileship verify/tune --verifier-key``); when set, evidence not
                            signed by one of them is ignored and the release serves as unverified
    TILESHIP_VERIFIER_KEY   the ed25519 private key (PEM) `verify` and `tune` sign evidence with
                            when no --verifier-key is given
    TILESHIP_ACTIVATOR_KEY  the ed25519 private key (PEM) `activate`, `rollback` (every registry change of the
                            pointer) seal ``active.json`` with when no --sign-key is given
    TILESHIP_POINTER_VALID_FOR  how long a pointer `activate`, `rollback` (every registry change of the pointer)
                            seal stays valid when no --valid-for is given, e.g. 7d, 12h (``release.pointer_expiry``:
                            readers that check the seal refuse it after); unset: no expiry
    TILESHIP_TRUSTED_ACTIVATOR_KEYS  os.pathsep-separated ed25519 public keys (PEM) of the activator role;
                            when set, `tileship serve REGISTRY` refuses a pointer not sealed by one of
                            them, or older than the one it serves (``release.pointer_seal``)
    TILESHIP_TRUSTED_REGISTRY_ID  the registry id (32 hex digits, ``registry.json``) a pointer must be bound to
                            wherever activator keys are trusted (``serve --trusted-registry-id``): another
                            registry's pointer is refused even by a fresh server (``release.pointer_seal``)
    TILESHIP_POINTER_STATE  a file where `tileship serve REGISTRY` keeps the pointer it served (its generation),
                            read at start so a restarted server refuses an older one (``--generation-state``)
    TILESHIP_ALLOW_UNVERIFIED  "1" to run unverified kernels on a GPU (default off)
    TILESHIP_ALLOW_REFERENCE_DRIFT  "1" to load a release whose pinned reference modules differ from
                            the ones this process imports (default off: ReferenceDrift)
    TILESHIP_FAST_LAUNCH    "off" (or "adapter") to keep CUDA kernels on TileLang's per-call adapter
                            (default: the fast launcher on CPU and CUDA; on the H200 it served every
                            CUDA kernel of the catalog correctly, benchmarks/results/h200/launch/)
    TILESHIP_RAY_FAULT_ONCE a file path (tests only): the first Ray build task to see it missing
                            creates it and kills its worker process, to exercise Ray's retry
    TILESHIP_IMAGE_DIGEST   the digest (sha256:<64 hex>) of the container image this process runs in,
                            set by the deployment (an image cannot know its own digest at build
                            time); the server reports it and warns when the release pins another
    TILESHIP_MAX_ARCHIVE_BYTES  the most a `tileship pack` archive may unpack to (default 64 GiB)
    TILELANG_CACHE_DIR      TileLang needs a writable cache dir to import; when unset
                            tileship points it at a private temp dir (a release never reads it)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("TILESHIP_HOME", ".tileship")).resolve()


def trusted_key_paths() -> list[Path]:
    raw = os.environ.get("TILESHIP_TRUSTED_KEYS", "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


def trusted_verifier_key_paths() -> list[Path]:
    raw = os.environ.get("TILESHIP_TRUSTED_VERIFIER_KEYS", "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


def verifier_key() -> Path | None:
    raw = os.environ.get("TILESHIP_VERIFIER_KEY", "").strip()
    return Path(raw) if raw else None


def activator_key() -> Path | None:
    raw = os.environ.get("TILESHIP_ACTIVATOR_KEY", "").strip()
    return Path(raw) if raw else None


def pointer_valid_for() -> str | None:
    """``TILESHIP_POINTER_VALID_FOR`` as given (``pointer_expiry.valid_for`` parses it, naming the variable when it
    is not a duration); None when unset or empty."""
    raw = os.environ.get("TILESHIP_POINTER_VALID_FOR", "").strip()
    return raw or None


def trusted_activator_key_paths() -> list[Path]:
    raw = os.environ.get("TILESHIP_TRUSTED_ACTIVATOR_KEYS", "")
    return [Path(p) for p in raw.split(os.pathsep) if p]


def trusted_registry_id() -> str | None:
    """``TILESHIP_TRUSTED_REGISTRY_ID`` as given (``pointer_seal.trusted_registry`` checks its shape); None when
    unset or empty."""
    raw = os.environ.get("TILESHIP_TRUSTED_REGISTRY_ID", "").strip()
    return raw or None


def pointer_state() -> Path | None:
    raw = os.environ.get("TILESHIP_POINTER_STATE", "").strip()
    return Path(raw) if raw else None


def allow_reference_drift() -> bool:
    return os.environ.get("TILESHIP_ALLOW_REFERENCE_DRIFT", "").strip().lower() in ("1", "true", "yes", "on")


def allow_unverified() -> bool | None:
    raw = os.environ.get("TILESHIP_ALLOW_UNVERIFIED")
    return None if raw is None else raw.strip().lower() in ("1", "true", "yes", "on")


def image_digest() -> str | None:
    """``TILESHIP_IMAGE_DIGEST`` when it is a well-formed ``sha256:<64 hex>``; None when unset.
    A malformed value is returned as given: the server reports it (and so the mismatch) as it is."""
    raw = os.environ.get("TILESHIP_IMAGE_DIGEST", "").strip()
    return raw or None


def fast_launch_cuda() -> bool:
    """Whether CUDA kernels may use the fast launcher: yes unless ``TILESHIP_FAST_LAUNCH`` says
    ``off``, ``adapter``, ``0`` or ``cpu`` (the CPU only)."""
    words = os.environ.get("TILESHIP_FAST_LAUNCH", "").lower().replace(",", " ").split()
    return not any(w in ("off", "adapter", "0", "false", "cpu") for w in words)


def native_call() -> bool:
    """Whether a release's compiled dispatch table (``runtime.native``) may serve kernel calls: yes
    unless ``TILESHIP_NATIVE_CALL`` says ``off``, ``0``, ``false`` or ``no``."""
    return os.environ.get("TILESHIP_NATIVE_CALL", "").strip().lower() not in ("off", "0", "false", "no")


def c_compiler() -> str | None:
    """``CC``: the C compiler ``tileship build`` compiles the dispatch table with; None when unset."""
    return os.environ.get("CC", "").strip() or None


def ray_fault_once() -> Path | None:
    """``TILESHIP_RAY_FAULT_ONCE``: a marker file; a Ray build task that finds it missing creates
    it and exits its worker process (a lost task, retried by Ray). Tests only."""
    raw = os.environ.get("TILESHIP_RAY_FAULT_ONCE")
    return Path(raw) if raw else None


def ensure_tilelang_cache_dir() -> str:
    """Give TileLang a writable cache dir before it is imported; return it.

    A release never loads from it (artifacts come from the bundle), but ``import tilelang``
    fails without one, e.g. on a read-only image.
    """
    current = os.environ.get("TILELANG_CACHE_DIR")
    if current and os.access(current, os.W_OK):
        return current
    path = tempfile.mkdtemp(prefix="tileship-tlcache-")
    os.environ["TILELANG_CACHE_DIR"] = path
    return path


def max_archive_bytes() -> int:
    """``TILESHIP_MAX_ARCHIVE_BYTES``: the most a ``tileship pack`` archive may unpack to (default
    64 GiB; a larger release is refused before anything is written). An unparsable value: the default."""
    raw = os.environ.get("TILESHIP_MAX_ARCHIVE_BYTES", "").strip()
    return int(raw) if raw.isdigit() else 64 << 30
