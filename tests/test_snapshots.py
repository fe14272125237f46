"""A loaded release reads a private snapshot of its bundle; a server reloaded many times keeps a
bounded number of them (issue 17): the current release's and the last ``RETIRED_KEEP`` ones'."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
from test_serve import client, copy_release, infer, point, post, serving

from tileship.runtime.loader import load
from tileship.serve import ServeConfig
from tileship.serve.holder import RETIRED_KEEP


def test_close_removes_the_snapshot_and_its_sources_path(cpu_release):
    release = load(cpu_release)
    snap = Path(release.snapshot)
    assert snap.is_dir() and (snap / "release.json").is_file()
    assert not snap.is_relative_to(cpu_release)  # a private copy, not the bundle
    release.close()
    assert not snap.exists() and str(snap / "sources") not in sys.path
    release.close()  # idempotent
    assert (cpu_release / "release.json").is_file()  # the bundle itself is untouched


def test_reloads_keep_a_bounded_number_of_snapshots(cpu_release_build, tmp_path):
    versions = [copy_release(cpu_release_build.path, tmp_path / f"v{i}",
                             version=str(i + 2)) for i in range(RETIRED_KEEP + 3)]
    link = tmp_path / "current"
    point(link, versions[0])
    with serving(ServeConfig(source=link, diagnostics_dir=tmp_path / "diag", log_stream=io.StringIO())) as srv:
        holder = srv.service.holder
        snaps = [Path(holder.current.release.snapshot)]
        for v in versions[1:]:
            point(link, v)
            r = post(srv, "/v2/repository/reload")
            assert r.status_code == 200 and r.json()["result"] == "swapped", r.text
            snaps.append(Path(holder.current.release.snapshot))
        alive = [s.exists() for s in snaps]
        kept = RETIRED_KEEP + 1  # the current one and the last RETIRED_KEEP swapped out
        assert alive == [False] * (len(snaps) - kept) + [True] * kept, alive
        assert len(holder.retired) == RETIRED_KEEP
        x, y = np.arange(300, dtype=np.float32), np.ones(300, dtype=np.float32)
        res = infer(client(srv), "add", {"A": x, "B": y}, binary=True, out="C")
        assert np.allclose(res.as_numpy("C"), x + y)  # the current release still serves from its snapshot
