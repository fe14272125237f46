"""Key pairs on disk (`tileship keygen`): written whole or not at all, never over an existing key.

Both keys are written to temporaries beside their paths (each writer its own, ``atomic_file.temporary``: keygens
in threads of one process never share one) and fsynced, then linked into place without replacing anything
(``os.link`` fails on an existing name): the private key first, then the public one. A kill at any instant
leaves no key, a complete private key alone, or the complete pair; never a truncated key and never a private key
next to another key's public half. The next ``generate_key`` on the same path finishes the first case's pair from
the private key (the public key is derived from it) and refuses to overwrite a key that exists.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tileship.errors import SignatureError
from tileship.release import nofollow
from tileship.release.atomic_file import abandoned, temporary


def public_path(private_path: Path) -> Path:
    """Where the public half of ``private_path`` is written: ``<private path>.pub``."""
    return private_path.with_suffix(private_path.suffix + ".pub")


def generate_key(private_path: Path) -> Path:
    """Write a new ed25519 private key (PEM, 0600) and its public key beside it (``.pub``). Returns the
    ``.pub`` path. Raises SignatureError naming the file when either key already exists or either path is a
    symlink (nothing is written) and when the directory is not writable. A private key whose ``.pub`` is missing (a
    keygen killed between the two) gets its public key written and is kept: see ``complete_pair``."""
    private_path = Path(private_path)
    pub = public_path(private_path)
    _refuse_links(private_path, pub)
    _remove_leftovers(private_path)
    if private_path.exists() and not pub.exists():
        raise SignatureError(f"{private_path}: a private key without its public key {pub.name} exists (a keygen "
                             f"killed before it finished?)", path=str(private_path),
                             hint=f"`tileship keygen {private_path}` again writes the public key from it "
                                  "(complete_pair); or remove it")
    for existing in (private_path, pub):
        if existing.exists():
            raise SignatureError(f"{existing}: a key already exists there; keygen never overwrites a key",
                                 path=str(existing), hint="choose another path, or remove the old key pair first")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    _commit(private_path, pem, 0o600)
    _commit(pub, _public_pem(key), 0o644)
    return pub


def complete_pair(private_path: Path) -> Path:
    """Write the missing public key of ``private_path`` (derived from it). Returns its path. Raises
    SignatureError when the private key is unreadable or the public key already exists (or is a symlink)."""
    from tileship.release.bundle import load_private_key

    private_path = Path(private_path)
    pub = public_path(private_path)
    _refuse_links(pub)
    _remove_leftovers(private_path)
    if pub.exists():
        raise SignatureError(f"{pub}: the public key already exists", path=str(pub))
    _commit(pub, _public_pem(load_private_key(private_path)), 0o644)
    return pub


def _refuse_links(*paths: Path) -> None:
    """A key is never written through a symlink (unlike ``atomic_file``'s files): its target could be anywhere."""
    for path in paths:
        if path.is_symlink():
            raise SignatureError(f"{path} is a symlink; keygen writes a key only to a new path, never through a link",
                                 path=str(path), hint="pass the path the key should be written to")


def _public_pem(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _commit(path: Path, body: bytes, mode: int) -> None:
    """``body`` at ``path``, whole, or nothing there (temporary, fsync, link without replacing)."""
    tmp = temporary(path, hidden=True)  # never another writer's: keygens in threads of one process at once
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError:
        raise SignatureError(f"{path}: a key already exists there; keygen never overwrites a key",
                             path=str(path), hint="choose another path") from None
    except OSError as exc:
        raise SignatureError(f"{path}: cannot write the key ({exc.strerror or exc})", path=str(path)) from None
    finally:
        tmp.unlink(missing_ok=True)
    nofollow.fsync_dir(path.parent)


def _remove_leftovers(private_path: Path) -> None:
    """The temporaries of keygens killed before they finished (their process is gone)."""
    for path in (private_path, public_path(private_path)):
        for tmp in path.parent.glob(glob.escape(f".{path.name}") + ".tmp*"):
            if abandoned(tmp.name, f".{path.name}"):
                tmp.unlink(missing_ok=True)


__all__ = ["complete_pair", "generate_key", "public_path"]
