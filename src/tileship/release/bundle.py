"""Release bundles: a directory whose every file is listed, hashed and optionally signed.

Layout::

    manifest.json        {"schema", "release_id", "files": {posix path: "sha256:<hex>"}}
    manifest.sig         optional: {"key_id", "signature"} ed25519 over manifest.json's bytes
    tileship.lock        the lock (YAML)
    release.json         model, policy, operators, specializations and their build status
    build-log.json       per specialization: seconds, compiler commands, logs (not in the id)
    specs/<spec id>/     func.json, the compiled library, params.json, device/host sources
    evidence/            verification evidence (hashed, not part of the release id)

The release id is the sha256 of the identity files (everything except the build log and
evidence), so building twice from the same inputs gives the same id.
"""

from __future__ import annotations

import base64
import errno
import glob
import hashlib
import json
import os
import shutil
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tileship.build.lock import sha256_file
from tileship.errors import BundleError, BundleIntegrityError, SignatureError
from tileship.release import strict_json
from tileship.release.inplace import leftover, running, settle, write_atomic, writing
from tileship.release.keys import generate_key  # noqa: F401 (re-exported)

MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
#: files hashed in the manifest but left out of the release id
NON_IDENTITY_PREFIXES = ("build-log.json", "evidence/")


def _files(root: Path) -> list[str]:
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() or p.is_symlink():
            rel = p.relative_to(root).as_posix()
            if rel not in (MANIFEST, SIGNATURE) and not leftover(rel):
                out.append(rel)
    return out


def release_id_of(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for path in sorted(files):
        if not path.startswith(NON_IDENTITY_PREFIXES):
            h.update(f"{path}\0{files[path]}\n".encode())
    return h.hexdigest()[:16]


def json_bytes(data: Any) -> bytes:
    """How tileship writes a JSON file (sorted keys, indented, one newline at the end)."""
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def write_json_atomic(path: Path, data: Any) -> None:
    """``path`` replaced whole by ``data`` as tileship writes JSON (``inplace.write_atomic``)."""
    write_atomic(path, json_bytes(data))


def write_manifest(root: Path) -> dict[str, Any]:
    """Hash every file under ``root`` and write the manifest (atomically). Returns it.

    Re-writing the manifest invalidates an existing signature, which is removed.
    """
    files = {rel: sha256_file(root / rel) for rel in _files(root)}
    manifest = {"schema": 1, "release_id": release_id_of(files), "files": files}
    write_json_atomic(root / MANIFEST, manifest)
    (root / SIGNATURE).unlink(missing_ok=True)
    return manifest


def read_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    try:
        data = strict_json.loads(path.read_bytes(), path, "manifest")
    except FileNotFoundError:
        raise BundleIntegrityError(f"{path}: manifest missing: not a tileship release", path=str(path)) from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict) or "release_id" not in data:
        raise BundleIntegrityError(f"{path}: manifest lacks files/release_id", path=str(path))
    return data


def check_integrity(root: Path) -> dict[str, Any]:
    """Verify every file against the manifest (no signature). Returns the manifest.

    Raises BundleIntegrityError naming the file: hash mismatch, missing, not listed, a path
    leaving the release, a non-regular file, or an edited manifest. See ``integrity.check``.
    """
    from tileship.release import integrity

    return integrity.check(root, trusted_keys=[]).manifest


# -- signing -------------------------------------------------------------------

def key_id(pub: Ed25519PublicKey) -> str:
    """How tileship names a public key: ``ed25519:`` and 16 hex digits of the sha256 of its raw bytes."""
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise SignatureError(f"{path}: not a PEM public key ({exc})", path=str(path)) from None
    if not isinstance(key, Ed25519PublicKey):
        raise SignatureError(f"{path}: not an ed25519 key", path=str(path))
    return key


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """An ed25519 private key (PEM). Raises SignatureError naming the file."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise SignatureError(f"{path}: not a PEM private key ({exc})", path=str(path)) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError(f"{path}: not an ed25519 key", path=str(path))
    return key


def signature_record(key: Ed25519PrivateKey, body: bytes) -> dict[str, str]:
    """The JSON a signature file holds: ``{"key_id", "signature"}`` (base64 ed25519 over ``body``)."""
    return {"key_id": key_id(key.public_key()), "signature": base64.b64encode(key.sign(body)).decode()}


def sign(root: Path, private_key_path: Path) -> str:
    """Sign ``root``'s manifest (the bytes integrity was checked on). Returns the key id."""
    from tileship.release import integrity

    key = load_private_key(private_key_path)
    with writing(root):  # not while an evidence write changes the manifest under it
        body = integrity.check(root, trusted_keys=[]).manifest_bytes
        record = signature_record(key, body)
        settle(root, body)
        write_json_atomic(root / SIGNATURE, record)
    return record["key_id"]


def verify_signature(root: Path, trusted: Iterable[Ed25519PublicKey]) -> str:
    """Check the signature against the trusted keys. Returns the signing key id."""
    return verify_signature_bytes(read_or_none(root / MANIFEST) or b"", read_or_none(root / SIGNATURE),
                                  root / SIGNATURE, trusted)


def read_or_none(path: Path) -> bytes | None:
    """The bytes of ``path``, or None when there is no such file."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def verify_signature_bytes(body: bytes, sig_file: bytes | None, path: Path, trusted: Iterable[Ed25519PublicKey]) -> str:
    """Check ``sig_file`` (the bytes of ``manifest.sig``) over ``body``. Returns the signing key id.

    Raises SignatureError naming ``path``: unsigned, malformed, or made by no trusted key.
    """
    if sig_file is None:
        raise SignatureError(f"{path}: release is not signed but a trusted key is required", path=str(path))
    try:
        data = strict_json.loads(sig_file, path, "signature file", SignatureError)
        sig = base64.b64decode(data["signature"], validate=True)
    except SignatureError as exc:
        raise SignatureError(f"{path}: malformed signature file ({exc.message.split(': ', 1)[-1]})",
                             path=str(path)) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise SignatureError(f"{path}: malformed signature file ({exc})", path=str(path)) from None
    for key in trusted:
        try:
            key.verify(sig, body)
        except InvalidSignature:
            continue
        return key_id(key)
    raise SignatureError(f"{path}: signature does not verify with any trusted key (key id {data.get('key_id')})",
                         path=str(path),
                         hint="sign with a trusted key (`tileship sign`) or add its public key to the trusted set")


# -- packing -------------------------------------------------------------------

def pack(root: Path, archive: Path) -> Path:
    """Write one reproducible .tar.gz of the release (sorted, zeroed owners and times); returns ``archive``.
    The archive is the user's file (``atomic_file.replacing``): a symlink is written through (its final target
    is replaced, the link stays), an existing archive keeps its mode, and what is not a regular file is refused
    (OSError, nothing written). The files packed are the bytes integrity checked (a private copy made while
    hashing, in a scratch directory ``<target>.tmp<pid>-copy-*`` beside the file written), written to a
    temporary of its own (``<target>.tmp<pid>-<random>``), fsynced, then renamed: killed at any instant, the
    archive is the old one or the new one, whole; concurrent packs to one path never mix. The scratch directories and
    temporaries of killed packs (their pid gone) are removed by the next pack to that path."""
    import gzip
    import tempfile

    from tileship.release import integrity
    from tileship.release.atomic_file import replacing, target_of

    dest = target_of(Path(archive))  # the scratch copy goes beside the file the rename replaces
    for left in dest.parent.glob(glob.escape(dest.name) + ".tmp*-*"):  # what killed packs left
        pid = left.name[len(dest.name) + 4:].partition("-")[0]
        if pid.isdigit() and not running(int(pid)):
            if left.is_dir() and not left.is_symlink():
                shutil.rmtree(left, ignore_errors=True)
            else:
                left.unlink(missing_ok=True)
    if dest.exists() and not dest.is_file():
        raise OSError(errno.EINVAL, "not a regular file", str(archive))  # before the release is copied
    scratch = Path(tempfile.mkdtemp(dir=dest.parent, prefix=dest.name + f".tmp{os.getpid()}-copy-"))
    try:
        checked = integrity.check(root, trusted_keys=[], copy_to=scratch / "copy")
        copy, manifest = scratch / "copy", checked.manifest
        names = [MANIFEST, *([SIGNATURE] if checked.signature_bytes is not None else []),
                 *sorted(manifest["files"])]
        with replacing(archive) as (raw, _):
            with gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as gz:
                _tar(gz, copy, names, manifest["release_id"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return archive


def _tar(out: Any, src: Path, names: list[str], top: str) -> None:
    """Write ``names`` (files under ``src``) as one tar stream into ``out``, under ``top/``, with
    zeroed owners and times: the same bytes for the same files."""
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name in names:
            info = tar.gettarinfo(str(src / name), arcname=f"{top}/{name}")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            info.mode = 0o644
            with open(src / name, "rb") as f:
                tar.addfile(info, f)


def unpack(archive: Path, dest: Path) -> Path:
    """Extract a packed release under ``dest``; integrity is checked before it is returned. An
    unreadable archive (truncated, a corrupt stream) raises ``tarfile.ReadError`` (the filesystem's
    own errors, a full disk among them, stay OSError); members outside one top directory (absolute,
    ``..``), what ``release.archive`` refuses before extracting (links, special files, a name given
    twice, more data than the limit or the free space, bytes after the end) and a failed check raise
    BundleError naming the archive, never the temporary ``dest``."""
    import zlib
    from pathlib import PurePosixPath

    from tileship.release import archive as archive_check

    try:
        with tarfile.open(archive, "r:gz", tarinfo=archive_check.Header) as tar:
            tops = set()
            listed = archive_check.members(tar, archive, dest)
            for m in listed:
                parts = PurePosixPath(m.name).parts
                if m.name.startswith("/") or ".." in parts:
                    raise BundleError(f"{archive}: member {m.name[:200]!r} leaves the archive's release directory",
                                      path=str(archive))
                if parts:  # "." and "./" name the archive's own top: nothing to place
                    tops.add(parts[0])
            if len(tops) != 1:
                raise BundleError(f"{archive}: expected one release directory, found {sorted(tops)[:8]}",
                                  path=str(archive))
            archive_check.no_trailing_data(tar, archive)
            tar.extractall(dest, members=listed, filter="data")
    except (EOFError, zlib.error, ValueError) as exc:  # what gzip and tarfile raise for a damaged stream
        raise tarfile.ReadError(f"a damaged archive ({type(exc).__name__}: {exc})") from None
    root = dest / tops.pop()
    try:
        check_integrity(root)
    except BundleError as exc:  # name the archive, not the temporary directory it was unpacked into
        raise type(exc)(f"{archive}: {exc.message.replace(str(root) + '/', '')}", path=str(archive),
                        hint=exc.hint) from None
    return root


def copy_release(src: Path, dest: Path) -> None:
    """Copy a release directory to ``dest`` atomically: its listed files only, hashed while copied into a
    temporary of this call's own (``<dest>.tmp<pid>-<random>``), fsynced, then one rename of the complete copy.
    Raises BundleError naming the file; OSError (ENOTEMPTY) when ``dest`` is a directory already there (a copy of
    another call at once, which stays), the temporary removed."""
    from tileship.release import integrity, nofollow
    from tileship.release.atomic_file import temporary

    tmp = temporary(dest)
    try:
        integrity.check(src, trusted_keys=[], copy_to=tmp, durable=True)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    nofollow.fsync_dir(dest.parent)
