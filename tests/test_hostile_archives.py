"""Hostile `tileship pack` archives (found by a tamper hunt, 2026-12-05): what tarfile's ``data``
filter lets through is refused before anything is extracted, naming the archive and the member, and
the registry is left as it was. Before: a member given twice was extracted twice (the second copy
replaced the first; only the hash check that followed stood between it and the registry), links
inside the release were extracted, a member declaring 1 TiB (or a compression bomb) was written to
the registry's disk until it filled, and bytes after the archive's end were ignored."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tileship.errors import BundleError, TileshipError
from tileship.release import bundle
from tileship.release.registry import Registry


@pytest.fixture(scope="module")
def packed(cpu_release_build, tmp_path_factory) -> tuple[Path, list[tuple[tarfile.TarInfo, bytes | None]]]:
    """The CPU release packed, and its members with their bytes (read-only)."""
    good = bundle.pack(cpu_release_build.path, tmp_path_factory.mktemp("packed") / "good.tar.gz")
    with tarfile.open(good) as t:
        items = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t.getmembers()]  # type: ignore[union-attr]
    return good, items


def _write(path: Path, items: list[tuple[tarfile.TarInfo, bytes | None]], tail: bytes = b"") -> Path:
    with open(path, "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb", mtime=0, compresslevel=1) as gz, \
                tarfile.open(fileobj=gz, mode="w") as t:
            for m, data in items:
                t.addfile(m, io.BytesIO(data) if data is not None else None)
        f.write(tail)
    return path


def _member(name: str, data: bytes = b"", **attrs: object) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in attrs.items():
        setattr(info, k, v)
    return info, data


def _lib(items: list[tuple[tarfile.TarInfo, bytes | None]]) -> tuple[tarfile.TarInfo, bytes]:
    m, data = next((m, d) for m, d in items if m.name.endswith("kernel_lib.so"))
    assert data is not None
    return m, data


Case = Callable[[list[tuple[tarfile.TarInfo, bytes | None]]], tuple[list[tuple[tarfile.TarInfo, bytes | None]], bytes]]


def _override_first(items):  # a forged library first, then the verified one replacing it on extraction
    m, data = _lib(items)
    return [_member(m.name, b"\x7fELF forged"), *items], b""


def _override_second(items):  # the verified library first, a forged one after it
    m, data = _lib(items)
    return [*items, _member(m.name, b"\x7fELF" + data[4:][::-1])], b""


def _same_twice(items):
    m, data = _lib(items)
    return [*items, _member(m.name, data)], b""


def _link(kind: bytes, target: str) -> Case:
    def case(items):
        top = items[0][0].name.split("/")[0]
        return [*items, _member(f"{top}/specs/alias", type=kind, linkname=target)], b""
    return case


def _hardlink_over_library(items):  # the library's bytes given by a hard link to another member
    m, data = _lib(items)
    rest = [(i, d) for i, d in items if i.name != m.name]
    twin = _member(m.name.replace("kernel_lib.so", "twin.so"), data)
    return [*rest, twin, _member(m.name, type=tarfile.LNKTYPE, linkname=twin[0].name)], b""


def _fifo(items):
    return [*items, _member(items[0][0].name.split("/")[0] + "/specs/pipe", type=tarfile.FIFOTYPE)], b""


def _trailing(tail: bytes) -> Case:
    return lambda items: (list(items), tail)


CASES: dict[str, tuple[Case, str]] = {
    "duplicate-forged-first": (_override_first, "appears twice"),
    "duplicate-forged-second": (_override_second, "appears twice"),
    "duplicate-same-bytes": (_same_twice, "appears twice"),
    "symlink-inside": (_link(tarfile.SYMTYPE, "../release.json"), "is a link or a special file"),
    "symlink-outside": (_link(tarfile.SYMTYPE, "/etc/passwd"), "is a link or a special file"),
    "hardlink-inside": (_hardlink_over_library, "is a link or a special file"),
    "hardlink-outside": (_link(tarfile.LNKTYPE, "/etc/passwd"), "is a link or a special file"),
    "fifo": (_fifo, "is a link or a special file"),
    "garbage-after-the-gzip-stream": (_trailing(b"GARBAGE" * 10), "data after the end of the compressed stream"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_hostile_archive_is_refused_before_extraction_and_the_registry_is_unchanged(packed, tmp_path, case):
    good, items = packed
    make, words = CASES[case]
    members, tail = make(items)
    hostile = _write(tmp_path / f"{case}.tar.gz", members, tail)
    reg = Registry(tmp_path / "reg")
    rid = reg.publish(good)
    reg.activate(rid)
    before = (sorted(p.name for p in reg.releases_dir.iterdir()), reg.active())
    with pytest.raises(TileshipError) as e:
        reg.publish(hostile, replace=True)
    assert isinstance(e.value, BundleError) and str(hostile) in e.value.message and words in e.value.message, \
        e.value.message
    assert (sorted(p.name for p in reg.releases_dir.iterdir()), reg.active()) == before
    assert not list(reg.root.glob(".unpack-*")), "the refused archive's temporary was left behind"
    dest = tmp_path / "direct"
    with pytest.raises(BundleError, match=words):
        bundle.unpack(hostile, dest)
    assert not dest.exists() or not any(dest.rglob("*")), "something was extracted before the refusal"


def test_trailing_zero_padding_is_accepted_but_trailing_data_after_the_tar_end_is_not(packed, tmp_path):
    good, items = packed
    raw = gzip.decompress(good.read_bytes())
    padded = tmp_path / "padded.tar.gz"
    padded.write_bytes(gzip.compress(raw + b"\0" * 20480, mtime=0))
    assert bundle.unpack(padded, tmp_path / "a").name == items[0][0].name.split("/")[0]
    appended = tmp_path / "appended.tar.gz"  # a second archive hidden after the first one's end
    hidden = io.BytesIO()
    with tarfile.open(fileobj=hidden, mode="w") as t:
        info, data = _member("other/evil.so", b"\x7fELF")
        t.addfile(info, io.BytesIO(data))
    appended.write_bytes(gzip.compress(raw + hidden.getvalue(), mtime=0))
    with pytest.raises(BundleError, match="data after the end of the archive"):
        bundle.unpack(appended, tmp_path / "b")
    zeros = tmp_path / "zeros.tar.gz"  # a bomb of padding: refused after 1 MiB, not read to its end
    zeros.write_bytes(gzip.compress(raw + b"\0" * (8 << 20), compresslevel=1, mtime=0))
    with pytest.raises(BundleError, match="data after the end of the archive"):
        bundle.unpack(zeros, tmp_path / "c")


def test_a_huge_declared_size_is_refused_from_its_header_without_reading_or_writing(packed, tmp_path):
    """A header declaring 1 TiB with no data after it: refused at the header (reading on would be a
    truncated-archive error; extracting would try to write 1 TiB)."""
    good, items = packed
    huge = tarfile.TarInfo(items[0][0].name.split("/")[0] + "/specs/huge.bin")
    huge.size = 1 << 40
    buf = io.BytesIO()
    t = tarfile.open(fileobj=buf, mode="w")
    for m, data in items:
        t.addfile(m, io.BytesIO(data) if data is not None else None)
    body = buf.getvalue()[:t.offset]  # the members, without the end-of-archive blocks
    path = tmp_path / "huge.tar.gz"
    path.write_bytes(gzip.compress(body + huge.tobuf(format=tarfile.GNU_FORMAT), mtime=0))
    with pytest.raises(BundleError, match="declare more than"):
        bundle.unpack(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_compression_bomb_is_refused_past_the_limit_before_it_is_written(packed, tmp_path, monkeypatch):
    good, items = packed
    top = items[0][0].name.split("/")[0]
    bomb = _write(tmp_path / "bomb.tar.gz", [*items, _member(f"{top}/specs/zeros.bin", b"\0" * (64 << 20))])
    assert bomb.stat().st_size < 1 << 20  # 64 MiB of members in well under 1 MiB
    monkeypatch.setenv("TILESHIP_MAX_ARCHIVE_BYTES", str(16 << 20))
    with pytest.raises(BundleError, match="TILESHIP_MAX_ARCHIVE_BYTES"):
        bundle.unpack(bomb, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    monkeypatch.setenv("TILESHIP_MAX_ARCHIVE_BYTES", str(16 << 20))
    assert bundle.unpack(good, tmp_path / "good").name == top  # the real release fits the same limit


def test_a_huge_metadata_header_is_refused_before_tarfile_reads_it_into_memory(tmp_path):
    """A pax header declaring 512 MiB of zeros (2 MiB of gzip): tarfile read it whole into memory
    (about 550 MiB resident) before any member was seen. Now refused from its header, in a child
    process whose peak memory is measured (VmHWM: getrusage's maxrss survives exec, so it would
    count the forking test process)."""
    import subprocess
    import sys
    import zlib

    head = tarfile.TarInfo("././@PaxHeader")
    head.type, head.size = tarfile.XHDTYPE, 512 << 20
    path = tmp_path / "pax.tar.gz"
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(c.compress(head.tobuf(format=tarfile.USTAR_FORMAT)))
        for _ in range(512):
            f.write(c.compress(b"\0" * (1 << 20)))
        f.write(c.flush())
    assert path.stat().st_size < 4 << 20
    code = ("import sys, tarfile\nfrom pathlib import Path\nfrom tileship.release import bundle\n"
            "try:\n    bundle.unpack(Path(sys.argv[1]), Path(sys.argv[2]))\n"
            "except tarfile.ReadError as e:\n    print('refused:', e)\n"
            "hwm = next(x for x in Path('/proc/self/status').read_text().splitlines() if x.startswith('VmHWM'))\n"
            "print('rss_mib', int(hwm.split()[1]) >> 10)\n")
    out = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "out")], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert "refused: a metadata header ('././@PaxHeader') declares 536870912 bytes" in out, out
    rss = int(out.split("rss_mib")[1])
    assert rss < 300, f"{rss} MiB resident: the header was read into memory"
    reg = Registry(tmp_path / "reg")
    with pytest.raises(TileshipError, match="declares 536870912 bytes") as e:
        reg.publish(path)
    assert str(path) in e.value.message
