"""kill -9 at random instants of every registry change (issue 17's crash target), bounded in time.

    python benchmarks/registry_crash_trials.py --trials 200 --out benchmarks/results/cpu

Per operation (``publish``, ``publish --replace`` of the active release, ``activate``,
``rollback``, ``activate --reference``) and per trial: a fresh registry with two published
releases; a child process repeats the operation in a loop (``os.fsync`` slowed by
``--slow-fsync-ms``, same semantics, so that kills also land between a write and its rename)
and is killed with SIGKILL after a random delay. Then, in this process:

1. the state the kill left: the pointer names nothing, or a release directory that exists and
   passes its integrity check; so does every history entry (``inconsistent`` counts the others);
2. the next operation: ``activate`` on even trials, ``tileship gc`` (``Registry.collect``) on odd
   ones; afterwards no temporary (``.tmp*``, ``.incoming-*``, ``.trash-*``, ``.unpack-*``,
   ``.active.tmp-*``) and no superseded ``@n`` copy may be left (``leftovers`` counts the others),
   and the state is checked again.

``mid_operation`` counts kills that landed after the child printed ``begin`` and before its
``done``: kills inside a change, not between two. ``left_by_kill`` counts trials where the kill
left temporaries behind for the next operation to clean. ``tests/test_registry_crash.py`` runs
the same trials, fewer of them, in CI. Writes ``registry_crash_trials.json`` / ``.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

from tileship.release import bundle  # noqa: E402
from tileship.release.registry import Registry  # noqa: E402

OPS = ("publish", "replace", "activate", "rollback", "reference")
LEFTOVER = re.compile(r"\.tmp|^\.incoming-|^\.trash-|^\.unpack-|^\.active\.tmp-")

CHILD = textwrap.dedent("""
    import json, os, sys, time
    delay = float(sys.argv[4])
    if delay:
        _fsync = os.fsync
        os.fsync = lambda fd: (time.sleep(delay), _fsync(fd))[1]
    from tileship.release.registry import Registry
    op, root, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    reg = Registry(root)
    print("ready", flush=True)
    i = 0
    while True:
        print("begin", flush=True)
        if op == "publish":
            reg.publish(args[i % len(args)])
        elif op == "replace":
            reg.publish(args[i % 2], replace=True)
        elif op == "activate":
            reg.activate(args[i % 2])
        elif op == "rollback":
            reg.activate(args[1]) if i % 2 == 0 else reg.rollback()
        elif op == "reference":
            reg.activate_reference(args[0]) if i % 2 == 0 else reg.activate(args[1])
        print("done", flush=True)
        i += 1
""")


def fake_release(where: Path, tag: str, evidence: str | None = None) -> Path:
    """A small valid bundle (manifest over its files); ``evidence`` changes a non-identity file."""
    root = where / f"bundle-{tag}"
    (root / "specs" / "x").mkdir(parents=True)
    (root / "release.json").write_text(json.dumps({"model": {"name": "m", "version": tag}, "kernel_revision": tag}))
    (root / "specs" / "x" / "lib.so").write_bytes(tag.encode()[:1] * 20000)
    if evidence:
        (root / "evidence").mkdir()
        (root / "evidence" / "build-note.json").write_text(json.dumps({"note": evidence}))
    bundle.write_manifest(root)
    return root


def inconsistency(reg: Registry) -> str | None:
    """None when the pointer names nothing or a complete release and every history entry exists; else what is wrong."""
    try:
        active = reg.active()
        if active.release_id is not None:
            if active.path is None or not active.path.is_dir():
                return f"the pointer names a missing release {active.release_id}"
            bundle.check_integrity(active.path)
        for h in reg.history():
            bundle.check_integrity(reg.path_of(h["release_id"]))
    except Exception as exc:  # any error here is the finding
        return f"{type(exc).__name__}: {exc}"
    return None


def leftovers(reg: Registry) -> list[str]:
    found = [p.name for d in (reg.root, reg.releases_dir) if d.is_dir() for p in d.iterdir() if LEFTOVER.search(p.name)]
    ids = [p.name.partition("@")[0] for p in reg.releases_dir.iterdir() if not p.name.startswith(".")]
    return found + [f"duplicate copy of {i}" for i in sorted(set(ids)) if ids.count(i) > 1]


@dataclass
class Trial:
    op: str
    seed: int
    mid_operation: bool
    left_by_kill: list[str]
    next_operation: str
    after_kill: str | None
    after_next: str | None
    leftovers: list[str]
    seconds: float


def trial(op: str, where: Path, seed: int, *, max_delay_s: float = 0.08, slow_fsync_ms: float = 2.0,
          timeout_s: float = 30.0) -> Trial:
    """One kill and the next operation; never raises for what it measures (the fields say)."""
    t0 = time.monotonic()
    rnd = random.Random(seed)
    reg = Registry(where / "reg")
    a, b = fake_release(where, "a"), fake_release(where, "b")
    ra, rb = reg.publish(a), reg.publish(b)
    if op == "publish":
        args = [str(fake_release(where, f"p{i}")) for i in range(8)]
    elif op == "replace":
        reg.activate(ra)
        args = [str(fake_release(where / "e1", "a", "one")), str(fake_release(where / "e2", "a", "two"))]
    else:
        reg.activate(ra)
        args = [ra, rb]
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, op, str(reg.root), json.dumps(args),
                             str(slow_fsync_ms / 1000)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{op}: the child did not start")
        time.sleep(rnd.uniform(0.0, max_delay_s))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        rest = proc.stdout.read().split("\n")[:-1]  # complete lines only: the kill may cut the last one
        proc.wait(timeout=timeout_s)
    mid = bool(rest) and rest[-1] == "begin"
    after_kill = inconsistency(reg)
    left = leftovers(reg)
    if seed % 2 == 0:
        next_op = "activate"
        reg.activate(ra, force=True)
    else:
        next_op = "gc"
        reg.collect()
    return Trial(op, seed, mid, left, next_op, after_kill, inconsistency(reg), leftovers(reg), time.monotonic() - t0)


@dataclass
class Summary:
    op: str
    trials: int = 0
    mid_operation: int = 0
    left_by_kill: int = 0
    inconsistent: int = 0
    leftovers_after_next: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)


def run(op: str, trials: int, work: Path, *, workers: int = 4, budget_s: float = 600.0, seed0: int = 0,
        **kw: float) -> tuple[Summary, list[Trial]]:
    """Up to ``trials`` trials of ``op``, stopping early when ``budget_s`` is spent (the summary counts what ran)."""
    t0 = time.monotonic()
    deadline = t0 + budget_s
    out: list[Trial] = []

    def one(i: int) -> Trial | None:
        if time.monotonic() > deadline:
            return None
        return trial(op, work / f"{op}-{i}", seed0 + i, **kw)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        out = [t for t in pool.map(one, range(trials)) if t is not None]
    s = Summary(op, trials=len(out), seconds=time.monotonic() - t0)
    for t in out:
        s.mid_operation += t.mid_operation
        s.left_by_kill += bool(t.left_by_kill)
        if t.after_kill or t.after_next:
            s.inconsistent += 1
            s.failures.append(f"seed {t.seed}: {t.after_kill or t.after_next}")
        if t.leftovers:
            s.leftovers_after_next += 1
            s.failures.append(f"seed {t.seed}: left after {t.next_operation}: {t.leftovers}")
    return s, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=200, help="per operation")
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--budget-s", type=float, default=540.0, help="per operation: stop starting trials after this")
    p.add_argument("--max-delay-s", type=float, default=0.08, help="the kill lands uniformly in [0, this] after start")
    p.add_argument("--slow-fsync-ms", type=float, default=2.0)
    p.add_argument("--out", type=Path, default=None, help="write registry_crash_trials.json/.txt here")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tileship-crash-") as tmp:
        for op in args.ops:
            s, _ = run(op, args.trials, Path(tmp), workers=args.workers, budget_s=args.budget_s,
                       max_delay_s=args.max_delay_s, slow_fsync_ms=args.slow_fsync_ms)
            rows.append(s)
            print(f"{op:9s} {s.trials:4d} kills  {s.mid_operation:4d} mid-operation  {s.left_by_kill:4d} left "
                  f"temporaries  {s.inconsistent} inconsistent  {s.leftovers_after_next} with leftovers after the "
                  f"next operation  {s.seconds:6.1f} s", flush=True)
            for f in s.failures[:10]:
                print("   ", f)
    ok = all(r.inconsistent == 0 and r.leftovers_after_next == 0 and r.trials == args.trials for r in rows)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {"command": "python benchmarks/registry_crash_trials.py " + " ".join(argv or sys.argv[1:]),
               "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                        "load_avg": os.getloadavg()},
               "settings": {k: v for k, v in vars(args).items() if k != "out"},
               "ops": [asdict(r) for r in rows], "ok": ok}
        (args.out / "registry_crash_trials.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        lines = [
            f"{r.op:9s} {r.trials:4d} kills {r.mid_operation:4d} mid-operation {r.left_by_kill:4d} left-temporaries "
            f"{r.inconsistent} inconsistent {r.leftovers_after_next} leftovers-after-next {r.seconds:.1f} s"
            for r in rows
        ]
        (args.out / "registry_crash_trials.txt").write_text("\n".join([doc["command"], *lines, f"ok: {ok}"]) + "\n")
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
