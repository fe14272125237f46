"""Publishing into the registry: a release bundle copied into ``releases/``, whole or not at all.

A directory or a ``tileship pack`` archive (unpacked first, beside the registry) is integrity-checked, copied
with every file hashed while it is copied and fsynced, and renamed into place in one step. The identical
release again is a no-op; the same id with other non-identity files (newer evidence, a build log) is refused
unless ``replace``, and then a complete ``<id>@<n+1>`` is renamed into place before the older copy is removed
(``layout``). The image a release ships in is recorded beside it (``release.images``). A refusal of the
filesystem (a full disk) leaves the registry unchanged and is a RegistryError saying so.

``Registry`` (``release.registry``) inherits ``Publishing``; every change runs under the registry's lock.
"""

from __future__ import annotations

import errno
import tarfile
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from tileship.errors import BundleError, RegistryError
from tileship.release import bundle, images, layout


def _publish_failed(src: Path, exc: OSError, root: Path) -> RegistryError:
    """The error of a publish the filesystem refused (a directory's copy or an archive's unpacking)."""
    cause = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else exc.strerror
    return RegistryError(f"publishing {src} failed: {cause} ({exc.filename or root}); the registry is unchanged",
                         hint="free space on the registry's filesystem and publish again")


class Publishing:
    """Mixin of ``Registry``: ``publish`` and ``image_digest``."""

    root: Path
    releases_dir: Path

    if TYPE_CHECKING:  # Registry's methods, which these call
        def _locked(self) -> AbstractContextManager[list[str]]: ...

        def _current(self, rid: str) -> Path: ...

        def resolve(self, release_id: str) -> str: ...

        def gc(self) -> list[str]: ...

    def publish(self, source: Path | str, *, replace: bool = False, image_digest: str | None = None) -> str:
        """Copy a release bundle (directory or ``tileship pack`` archive) into the registry. Returns its id.

        Integrity is checked before and after the copy; the copy appears whole or not at all.
        Publishing the identical release again is a no-op. A release with the same id but
        other non-identity files (newer evidence, build log) is refused unless ``replace``.
        ``image_digest`` (``sha256:<64 hex>``, checked before anything is copied): record the image
        the release ships in (``release.images``; replaces an earlier record; the release itself is
        not changed). Raises BundleIntegrityError (names the file) or RegistryError.
        """
        src = Path(source)
        if image_digest is not None:
            images.check_digest(image_digest)
        with self._locked():
            if src.is_file():
                with tempfile.TemporaryDirectory(dir=self.root, prefix=".unpack-") as tmp:
                    try:
                        unpacked = bundle.unpack(src, Path(tmp))
                    except OSError as exc:
                        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                            raise RegistryError(f"{src}: not a release directory or a `tileship pack` archive "
                                                f"({exc})") from None
                        raise _publish_failed(src, exc, self.root) from None
                    except tarfile.TarError as exc:
                        raise RegistryError(f"{src}: not a release directory or a `tileship pack` archive "
                                            f"({exc})") from None
                    rid = self._publish_dir(unpacked, replace)
            else:
                rid = self._publish_dir(src, replace)
            if image_digest is not None:
                images.record(self.root, rid, image_digest)
            return rid

    def image_digest(self, release_id: str) -> str | None:
        """The image digest recorded for a published release (``publish --image-digest``), or None."""
        return images.recorded(self.root, self.resolve(release_id))

    def _publish_dir(self, src: Path, replace: bool) -> str:
        try:
            return self._publish_checked(src, replace)
        except OSError as exc:
            self.gc()
            raise _publish_failed(src, exc, self.root) from None

    def _publish_checked(self, src: Path, replace: bool) -> str:
        manifest = bundle.check_integrity(src)
        rid = manifest["release_id"]
        self.releases_dir.mkdir(parents=True, exist_ok=True)
        dest = self._current(rid)
        if dest.is_dir():
            try:
                there = bundle.read_manifest(dest)
                held: object = there["release_id"]
                same = (there == manifest
                        and bundle.read_or_none(dest / bundle.SIGNATURE) == bundle.read_or_none(src / bundle.SIGNATURE))
            except BundleError as exc:
                held, same = exc, False
            if same:
                bundle.check_integrity(dest)
                return rid
            if not replace:
                raise _published_otherwise(rid, dest, held)
            # the complete new copy appears (one rename) before the old one goes: no window without it
            newer = self.releases_dir / f"{rid}@{layout.version(dest) + 1}"
            bundle.copy_release(src, newer)
            layout.drop(dest)
        else:
            bundle.copy_release(src, dest)
        return rid


def _published_otherwise(rid: str, dest: Path, held: object) -> RegistryError:
    """Why ``publish`` (without ``--replace``) refuses ``rid`` whose registry copy ``dest`` differs: the copy
    holds another release (``held``: its manifest's id), has no readable manifest (``held``: that error), or
    holds ``rid`` with other evidence, signature or build log."""
    if isinstance(held, BundleError):
        return RegistryError(f"the registry's copy of release {rid} ({dest}) has no readable manifest: {held.message}",
                             hint="pass --replace to repair it with this release")
    if held != rid:
        return RegistryError(f"the registry's copy of release {rid} ({dest}) holds another release, {held}",
                             hint=f"pass --replace to repair it: the copy becomes release {rid} again")
    return RegistryError(f"release {rid} is already published with other evidence or build log ({dest})",
                         hint="pass --replace to overwrite the published copy")
