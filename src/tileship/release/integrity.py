"""One read of a release: what is hashed is what is loaded.

``check(root)`` is the single integrity gate of ``load``, ``tileship inspect``, ``publish`` and
``activate``:

- ``manifest.json`` and ``manifest.sig`` are read once; the manifest is parsed from the very
  bytes the signature is verified over.
- Every path is confined to the release: manifest paths may not be absolute, contain ``..``,
  ``.`` or empty parts; every directory on the way and every file is opened relative to the
  release with ``O_NOFOLLOW`` (``release.nofollow``), so no symlink is followed anywhere. Anything that is not a
  regular file or a directory (symlink, FIFO, socket, device) is refused, naming the file,
  without being opened.
- A directory named like a release id must carry that id; any other name is accepted with a
  warning and the manifest's id is used.
- With ``copy_to`` every listed file is copied while it is hashed, so the copy is exactly
  what was checked. ``snapshot()`` makes such a copy in a fresh 0700 directory that only this
  process reads; the loader dlopens from it, so a file swapped in the bundle after the check
  is never loaded.

Raises BundleIntegrityError or SignatureError naming the file; never anything else for a
malformed bundle.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tileship import env
from tileship.errors import BundleError, BundleIntegrityError, SignatureError
from tileship.release import snapshot_dirs, strict_json
from tileship.release.inplace import leftover, pending_manifests, raise_if_replaced
from tileship.release.nofollow import (
    DIR_FLAGS,
    fsync_tree_dirs,
    kind,
    open_regular,
    read_small,
    refuse,
    write_all,
    write_new,
)

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
#: a directory named like this claims to hold that release
RELEASE_DIR_RE = re.compile(r"([0-9a-f]{16})(@[0-9]+)?")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Checked:
    """A release that passed ``check``. ``snapshot``: the private copy, when one was made."""

    root: Path
    manifest: dict[str, Any]
    manifest_bytes: bytes
    signature_bytes: bytes | None
    key_id: str | None = None
    snapshot: Path | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def release_id(self) -> str:
        return str(self.manifest["release_id"])


def _present(root: Path) -> list[str]:
    """Every regular file below ``root`` (posix, relative); refuses anything else, naming it."""
    out: list[str] = []

    def walk(d: Path, prefix: str) -> None:
        with os.scandir(d) as it:
            for e in sorted(it, key=lambda e: e.name):
                rel = prefix + e.name
                st = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    walk(Path(e.path), rel + "/")
                elif stat.S_ISREG(st.st_mode):
                    out.append(rel)
                else:
                    raise refuse(root / rel, f"{kind(st.st_mode)}: only regular files are allowed in a release")

    walk(root, "")
    return [r for r in out if r not in (MANIFEST, SIGNATURE)]


def confined(rel: Any) -> bool:
    """True when ``rel`` is a relative posix path that cannot leave its directory."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\0" in rel:
        return False
    return all(p not in ("", ".", "..") for p in rel.split("/"))


def parse_manifest(data: bytes, path: Path) -> dict[str, Any]:
    """The manifest parsed from ``data`` (the bytes the signature covers), structure checked."""
    from tileship.release.bundle import release_id_of

    man = strict_json.loads(data, path, "manifest")
    if not (isinstance(man, dict) and isinstance(man.get("files"), dict) and isinstance(man.get("release_id"), str)):
        raise refuse(path, "manifest lacks files/release_id")
    for rel, digest in man["files"].items():
        if not confined(rel) or rel in (MANIFEST, SIGNATURE):
            raise refuse(path, f"unsafe path {rel!r} in manifest (absolute, '..', or not a plain relative path)")
        if not (isinstance(digest, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", digest)):
            raise refuse(path, f"malformed hash for {rel!r}")
    if release_id_of(man["files"]) != man["release_id"]:
        raise refuse(path, "release id does not match the listed files (manifest edited)")
    return man


def check(root: Path | str, *, trusted_keys: Iterable[Path] | None = None, copy_to: Path | None = None,
          durable: bool = False) -> Checked:
    """Check the release at ``root`` (see the module docstring). Returns what was checked.

    ``trusted_keys``: None reads ``TILESHIP_TRUSTED_KEYS``; an empty list checks no signature.
    ``copy_to`` (must not exist): copy every listed file there while hashing it, plus the
    manifest and signature bytes that were checked; ``durable`` fsyncs every copied file and
    directory (for the registry). Raises BundleError (or its subclasses) naming the file.

    Leftovers of a killed in-place write (``leftover``) are ignored, with a warning. When the
    files do not match ``manifest.json`` but do match a pending ``manifest.json.tmp<pid>-<random>`` (a
    writer killed between its renames: ``evidence.write`` writes the new manifest before it moves
    any file), that manifest is the one checked, with a warning; the next writer completes it.
    """
    real = Path(os.path.realpath(root))
    try:
        before = os.stat(real)
    except OSError:
        before = None
    try:
        return _check(root, MANIFEST, trusted_keys, copy_to, durable)
    except (BundleIntegrityError, OSError) as exc:
        raise_if_replaced(real, before, exc)
        if not isinstance(exc, BundleIntegrityError):
            raise  # e.g. a full disk while copying: the caller names it
        first: BundleError = exc
        for pending in pending_manifests(Path(os.path.realpath(root))):
            if copy_to is not None:
                shutil.rmtree(copy_to, ignore_errors=True)
            try:
                got = _check(root, pending, trusted_keys, copy_to, durable)
            except SignatureError as sig_exc:  # the files are whole; what is wrong is the signature
                first = sig_exc
                continue
            except BundleError:
                continue
            note = (f"{pending}: the manifest of an interrupted write (its writer was stopped between renames) "
                    f"describes the files; checked against it")
            return Checked(got.root, got.manifest, got.manifest_bytes, got.signature_bytes, got.key_id,
                           got.snapshot, (*got.warnings, note))
        raise first from None


def _check(root: Path | str, manifest_name: str, trusted_keys: Iterable[Path] | None, copy_to: Path | None,
           durable: bool) -> Checked:
    # the path a deployment names may be a pointer (a ``current`` symlink): resolve it once, then
    # nothing inside the release is followed
    given = Path(root)
    root = Path(os.path.realpath(given))
    if not root.is_dir():
        raise BundleError(f"{given}: no such release directory", path=str(given))
    try:
        root_fd = os.open(root, DIR_FLAGS)
    except OSError as exc:
        raise BundleError(f"{root}: cannot open the release directory ({exc.strerror})", path=str(root)) from None
    try:
        body = read_small(root_fd, manifest_name, root)
        if body is None:
            raise refuse(root / MANIFEST, "manifest missing: not a tileship release")
        sig = read_small(root_fd, SIGNATURE, root, limit=1 << 16)
        manifest = parse_manifest(body, root / MANIFEST)
        rid, warnings = manifest["release_id"], []
        named = RELEASE_DIR_RE.fullmatch(root.name)
        if named and named.group(1) != rid:  # the rule: use the manifest's id, and say so
            warnings.append(f"the directory is named after release {named.group(1)} but holds release {rid}; "
                            f"using the manifest's id {rid} (rename the directory to its release id)")
        elif not named:
            warnings.append(f"directory name {root.name!r} is not the release id; using the manifest's id {rid}")
        listed: dict[str, str] = manifest["files"]
        present = set(_present(root))
        for rel in sorted(r for r in present if leftover(r)):
            present.discard(rel)
            warnings.append(f"{rel}: the temporary of an interrupted write; not part of the release, ignored")
        for rel in sorted(set(listed) - present):
            raise refuse(root / rel, "listed in the manifest but missing")
        for rel in sorted(present - set(listed)):
            raise refuse(root / rel, "present but not listed in the manifest (extra file)")
        if copy_to is not None:
            copy_to.mkdir(mode=0o700)
        for rel in sorted(listed):
            data = _hash_copy(root_fd, root, rel, listed[rel], copy_to, durable)
            if data is not None:
                _check_artifact(root / rel, data, listed)
        if copy_to is not None:
            write_new(copy_to / MANIFEST, body, durable)
            if sig is not None:
                write_new(copy_to / SIGNATURE, sig, durable)
            if durable:
                fsync_tree_dirs(copy_to)
    finally:
        os.close(root_fd)
    kid = None
    keys = list(trusted_keys) if trusted_keys is not None else env.trusted_key_paths()
    if keys:
        from tileship.release import bundle

        kid = bundle.verify_signature_bytes(body, sig, root / SIGNATURE, [bundle.load_public_key(k) for k in keys])
    return Checked(root, manifest, body, sig, kid, copy_to, tuple(warnings))


def _check_artifact(path: Path, data: bytes, listed: dict[str, str]) -> None:
    """``specs/<id>/artifact.json``'s ``library`` must name a listed file of its own spec directory."""
    art = strict_json.loads(data, path, "artifact description")
    if not isinstance(art, dict):
        raise refuse(path, "artifact description is not a JSON object")
    lib = art.get("library")
    spec_dir = path.parent.name
    if not (isinstance(lib, str) and confined(lib) and "/" not in lib and f"specs/{spec_dir}/{lib}" in listed):
        raise refuse(path, f"library {lib!r} is not a file of its own specialization directory "
                           "(paths must stay inside specs/<id>/)")


def _hash_copy(root_fd: int, root: Path, rel: str, want: str, copy_to: Path | None, durable: bool) -> bytes | None:
    """Hash (and copy) one file; returns its bytes when it is an artifact description to check."""
    fd = open_regular(root_fd, rel, root)
    h = hashlib.sha256()
    out: int | None = None
    dest: Path | None = None
    keep = bytearray() if re.fullmatch(r"specs/[^/]+/artifact\.json", rel) else None
    try:
        if copy_to is not None:
            dest = copy_to / rel
            dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        while chunk := os.read(fd, _CHUNK):
            h.update(chunk)
            if keep is not None:
                keep += chunk
            if out is not None and dest is not None:
                write_all(out, chunk, dest)
        if out is not None and durable:
            os.fsync(out)
    finally:
        os.close(fd)
        if out is not None:
            os.close(out)
    if "sha256:" + h.hexdigest() != want:
        raise refuse(root / rel, "sha256 does not match the manifest (tampered or corrupted)")
    return bytes(keep) if keep is not None else None


def snapshot(root: Path | str, *, trusted_keys: Iterable[Path] | None = None) -> Checked:
    """``check`` with a private copy (a fresh 0700 temp dir held by this process, ``snapshot_dirs``: removed at
    exit, or by the next snapshot once this process was killed) that the loader reads."""
    parent = snapshot_dirs.make()
    name = Path(root).name if RELEASE_DIR_RE.fullmatch(Path(root).name) else "release"
    try:
        return check(root, trusted_keys=trusted_keys, copy_to=parent / name)
    except BaseException:
        snapshot_dirs.remove(parent)
        raise
