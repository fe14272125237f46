"""Kill a real `tileship` command at every write boundary, deterministically (a test helper).

``run(args, n)`` runs ``python -m tileship.cli ARGS`` in a child whose file-system calls are
counted: creating or renaming, linking, unlinking, fsyncing, removing a tree, and every ``write``
to a file opened for writing. At the ``n``-th one the child dies with ``os._exit(137)`` (no cleanup,
no ``finally``, as ``kill -9``); a write it dies in is half done (half the bytes reach the file).
``sweep`` runs ``n = 1, 2, ...`` until the command finishes before its ``n``-th boundary: every
boundary of that run is then one trial. Only the tileship process is hooked (compiler children
are not), so a sweep is exhaustive over tileship's own writes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

KILLED = 137
_BOOT = r"""
import atexit, builtins, io, os, shutil, sys
N = int(sys.argv[1]); count = [0]; armed = [os.environ.get("CRASHPOINTS_ARMED", "1") == "1"]
atexit.register(lambda: sys.stderr.write(f"crashpoints: {count[0]} boundaries\n"))
def arm():
    armed[0] = True
def boundary():
    if not armed[0]:
        return False
    count[0] += 1
    return count[0] == N
def die():
    os._exit(137)
def hook(fn):
    def wrapped(*a, **k):
        if boundary():
            die()
        return fn(*a, **k)
    return wrapped
for name in ("replace", "rename", "link", "unlink", "fsync", "mkdir", "rmdir", "symlink"):
    setattr(os, name, hook(getattr(os, name)))
shutil.rmtree = hook(shutil.rmtree)
class Half:
    def __init__(self, f): self._f = f
    def __getattr__(self, name): return getattr(self._f, name)
    def __enter__(self): return self
    def __exit__(self, *a): return self._f.__exit__(*a)
    def __iter__(self): return iter(self._f)
    def write(self, data):
        if boundary():
            self._f.write(data[: len(data) // 2]); self._f.flush(); die()
        return self._f.write(data)
_open = io.open
def opened(file, mode="r", *a, **k):
    f = _open(file, mode, *a, **k)
    return Half(f) if any(c in mode for c in "wax+") else f
builtins.open = io.open = opened
sys.argv = ["tileship", *sys.argv[2:]]
if os.environ.get("CRASHPOINTS_CODE"):
    exec(os.environ["CRASHPOINTS_CODE"])
else:
    from tileship.cli import main
    main()
"""


@dataclass(frozen=True)
class Outcome:
    n: int
    killed: bool
    returncode: int
    output: str


def boundaries(outcome: Outcome) -> int:
    """How many write boundaries a run that was not killed went through."""
    m = re.search(r"crashpoints: ([0-9]+) boundaries", outcome.output)
    assert m is not None and not outcome.killed, outcome.output[-500:]
    return int(m.group(1))


def run(args: Sequence[str], n: int, *, cwd: Path | None = None, timeout_s: float = 120.0,
        code: str | None = None) -> Outcome:
    """The command killed at its ``n``-th write boundary (``killed``), or run to its end. With ``code``,
    that Python code runs instead of the CLI (``sys.argv[1:]`` is ``args``); its boundaries count from
    its call of ``arm()`` on."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    if code is not None:  # it calls arm() where the boundaries start to count
        env.update(CRASHPOINTS_CODE=code, CRASHPOINTS_ARMED="0")
    r = subprocess.run([sys.executable, "-c", _BOOT, str(n), *args], capture_output=True, text=True,
                       cwd=cwd, env=env, timeout=timeout_s)
    return Outcome(n, r.returncode == KILLED, r.returncode, r.stdout + r.stderr)


def sweep(args: Sequence[str], *, before: Callable[[], None] | None = None, check: Callable[[Outcome], None],
          limit: int = 400, cwd: Path | None = None, step: int = 1, code: str | None = None) -> Iterator[Outcome]:
    """Kill the command at boundary 1, 1 + step, ... until it completes; ``before`` restores the
    starting state before each run, ``check`` asserts on the state each run left. Yields each outcome;
    raises AssertionError when the command never completes within ``limit`` boundaries."""
    for n in range(1, limit + 1, step):
        if before is not None:
            before()
        out = run(args, n, cwd=cwd, code=code)
        check(out)
        yield out
        if not out.killed:
            return
    raise AssertionError(f"{list(args)} still had write boundaries after {limit}")
