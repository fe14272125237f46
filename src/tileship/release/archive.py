"""Reading a ``tileship pack`` archive as hostile input, before anything is extracted.

``bundle.unpack`` extracts with tarfile's ``data`` filter (no absolute links, no devices, nothing
outside the destination) and checks the integrity of what landed. What the filter lets through,
refused here, each naming the archive and the member:

- a member that is not a regular file or a directory: ``pack`` writes neither links nor devices;
- a name given twice (after normalization): the second would silently replace the first;
- more data than the limit (BundleError), or than the destination's filesystem has free (OSError
  ENOSPC, as the full disk would give): the sizes are read from the headers, one at a time, so
  neither a huge declared size nor a compression bomb is written (or decompressed) past either;
- a pax or GNU long-name header of more than 1 MiB (``Header``): tarfile would read it into memory;
- bytes after the archive's end (beyond the zero padding a tar ends with), or after the gzip
  stream: not what ``pack`` wrote, and nothing any check would have looked at.
"""

from __future__ import annotations

import errno
import shutil
import tarfile
from pathlib import Path, PurePosixPath

from tileship import env
from tileship.errors import BundleError

#: the largest pax / GNU long-name header read (tarfile reads one whole into memory before any check)
_META_LIMIT = 1 << 20
_META_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
               tarfile.GNUTYPE_LONGLINK)
#: zero bytes a tar may end with (a record is 10 KiB; writers pad to one); more is trailing data
_PADDING = 1 << 20
_MAX_MEMBERS = 1_000_000


def _refuse(archive: Path, why: str) -> BundleError:
    return BundleError(f"{archive}: {why}", path=str(archive),
                       hint="an archive written by `tileship pack` never holds this; pack the release again")


class Header(tarfile.TarInfo):
    """A TarInfo (``tarfile.open(..., tarinfo=Header)``) that refuses a metadata header (pax, GNU long
    name) declaring more than 1 MiB before tarfile reads it whole into memory: 2 MiB of gzip made a
    512 MiB allocation before. Raises ``tarfile.ReadError`` naming the header, as for a damaged archive."""

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Header:
        info = super().frombuf(buf, encoding, errors)
        if info.type in _META_TYPES and info.size > _META_LIMIT:
            raise tarfile.ReadError(f"a metadata header ({info.name[:100]!r}) declares {info.size} bytes, more than "
                                    f"{_META_LIMIT}: not an archive `tileship pack` writes")
        return info


def members(tar: tarfile.TarFile, archive: Path, dest: Path) -> list[tarfile.TarInfo]:
    """Every member of ``tar``, read header by header. Raises BundleError naming the archive and the
    member (see the module docstring), OSError ENOSPC when ``dest``'s filesystem cannot hold them;
    the archive's own damage stays ``tarfile``'s error."""
    limit = env.max_archive_bytes()
    free = _free(dest)
    out: list[tarfile.TarInfo] = []
    seen: set[tuple[str, ...]] = set()
    total = 0
    while (m := tar.next()) is not None:
        name = m.name[:200]
        if not (m.isreg() or m.isdir()):
            raise _refuse(archive, f"member {name!r} is a link or a special file: a release holds regular files only")
        key = PurePosixPath(m.name).parts
        if m.isreg() and key in seen:
            raise _refuse(archive, f"member {name!r} appears twice (the second copy would replace the first)")
        seen.add(key)
        total += m.size
        if total > limit:
            raise _refuse(archive, f"the members declare more than {limit} bytes (at {name!r}; "
                                   "TILESHIP_MAX_ARCHIVE_BYTES sets the limit)")
        if total > free:  # the error a full disk gives, before any of it is written
            raise OSError(errno.ENOSPC, f"{archive}: the members declare {total}+ bytes, {free} are free", str(dest))
        out.append(m)
        if len(out) > _MAX_MEMBERS:
            raise _refuse(archive, f"more than {_MAX_MEMBERS} members")
    return out


def no_trailing_data(tar: tarfile.TarFile, archive: Path) -> None:
    """Raise BundleError when anything but zero padding follows the archive's end (read after
    ``members``: ``tar.offset`` is then the end of the last member)."""
    stream = tar.fileobj
    assert stream is not None
    stream.seek(tar.offset)
    seen = 0
    try:
        while chunk := stream.read(1 << 16):
            seen += len(chunk)
            if chunk.count(0) != len(chunk) or seen > _PADDING:
                raise _refuse(archive, f"data after the end of the archive (at byte {tar.offset} of the tar stream)")
    except OSError as exc:  # gzip: what follows the compressed stream is not another gzip member
        raise _refuse(archive, f"data after the end of the compressed stream ({exc})") from None


def _free(path: Path) -> int:
    """Bytes free on the filesystem that will hold ``path`` (its nearest existing ancestor's)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free
