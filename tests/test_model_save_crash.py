"""``tileship.torchops.swap.save`` killed while it writes a model file: the file there before stays whole and
loads (before: ``torch.save`` wrote the path in place, so a kill left it truncated, an unreadable zip), and a
kill at any write boundary of the replacement leaves the old file or the new one."""

from __future__ import annotations

from pathlib import Path

import crashpoints

#: save a model whose weights are all ``argv[2]`` to ``argv[1]``; with ``argv[3] == "mid"``, die (as ``kill -9``)
#: in the middle of torch's serialization, after a first record reached the file being written
CODE = """
import os, sys
import torch
import torch.serialization as ser
from tileship.torchops.swap import save
path, value, how = sys.argv[1], float(sys.argv[2]), sys.argv[3]
model = torch.nn.Linear(64, 64)
with torch.no_grad():
    for p in model.parameters():
        p.fill_(value)
if how == "mid":
    def dying(obj, zip_file, *a, **k):
        zip_file.write_record("data/0", b"x" * 4096, 4096)
        os._exit(137)
    ser._save = dying
arm()
save(model, path)
"""


def _weights(path: Path) -> set[float]:
    """The distinct weight values of the model file at ``path``, loaded as ``tileship`` loads one."""
    import torch

    from tileship.torchops.swap import load

    model = torch.nn.Linear(64, 64)
    assert load(model, path) is None  # a plain model: no kernel stamp
    return {float(v) for p in model.parameters() for v in p.detach().flatten().unique()}


def test_a_kill_midway_through_save_leaves_the_old_model_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    first = crashpoints.run([str(path), "1.0", "whole"], 10**6, code=CODE)
    assert first.returncode == 0, first.output[-2000:]
    assert _weights(path) == {1.0}
    killed = crashpoints.run([str(path), "2.0", "mid"], 10**6, code=CODE)
    assert killed.returncode == crashpoints.KILLED, killed.output[-2000:]
    assert _weights(path) == {1.0}, "the model file saved before was damaged by a save killed midway"
    again = crashpoints.run([str(path), "3.0", "whole"], 10**6, code=CODE)  # the killed save's temporary goes
    assert again.returncode == 0, again.output[-2000:]
    assert _weights(path) == {3.0}
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"], "a killed save's temporary was left"


def test_save_killed_at_write_boundaries_leaves_the_old_file_or_the_new_one(tmp_path: Path) -> None:
    """Every 5th boundary (torch's record writes, half done, the fsyncs, the rename): a save takes ~50."""
    path, old = tmp_path / "model.pt", tmp_path / "old.pt"
    made = crashpoints.run([str(old), "1.0", "whole"], 10**6, code=CODE)
    assert made.returncode == 0, made.output[-2000:]
    seen: set[str] = set()

    def fresh() -> None:
        path.write_bytes(old.read_bytes())

    def check(o: crashpoints.Outcome) -> None:
        assert o.killed or o.returncode == 0, o.output[-2000:]
        got = _weights(path)
        assert got in ({1.0}, {2.0}), f"boundary {o.n}: weights {got}"
        seen.add("old" if got == {1.0} else "new")

    outcomes = list(crashpoints.sweep([str(path), "2.0", "whole"], before=fresh, check=check, code=CODE, step=5))
    assert len(outcomes) >= 3 and outcomes[-1].returncode == 0 and seen == {"old", "new"}, seen
