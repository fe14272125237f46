"""The release's operators imported as a serving host will import them: from the source snapshot the
build shipped (``<release>/sources``), in a fresh process, under the no-JIT guard.

A module that imports from the project but not from the snapshot (it reads a data file next to it:
only ``.py`` files ship; it imports a module the build could not see) or that compiles a kernel on
import would build, then fail to load, verify and tune. ``start`` runs the check beside the compile
workers; ``finish`` raises ``BuildError`` naming the operator and why, before the release is written.
``python -m tileship.build.import_check SOURCES PAYLOAD`` is the child: it prints one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tileship.errors import BuildError

#: (field of the operator's description, what it is) for every callable a release imports by name
IMPORTED = (("reference", "reference"), ("sample", "sample hook"), ("cost", "cost model"))
DATA_HINT = ("only the operator modules' .py files ship in the release (sources/): a module must not read a file "
             "next to it at import; put the data in a .py module, or read it when called from a path the host gives")


@dataclass
class Running:
    proc: subprocess.Popen[str]
    out: IO[str]
    payload: Path


def start(descs: Mapping[str, Mapping[str, Any]], sources: Path, *, python: str,
          env: Mapping[str, str]) -> Running | None:
    """Start importing every operator's reference (sample, cost) from ``sources``; None when the release
    ships no sources (an installed package: the serving host imports it as the build did)."""
    if not any(d.get("sources") for d in descs.values()) or not sources.is_dir():
        return None
    fd, name = tempfile.mkstemp(prefix="tileship-import-check-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump({op: {k: d.get(k) for k in ("reference", "sample", "cost", "reference_imports")}
                   for op, d in descs.items()}, f)
    out = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([python, "-m", "tileship.build.import_check", str(sources), name], stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, cwd=sources,
                            env=dict(env), start_new_session=True)
    return Running(proc, out, Path(name))


def finish(run: Running | None, *, timeout_s: float) -> None:
    """Wait for ``run``; raise BuildError for the first operator whose import from the snapshot failed."""
    if run is None:
        return
    try:
        run.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
        raise BuildError(f"importing the operator modules from the release's sources took over {timeout_s:g} s",
                         hint="an operator module must import quickly: no work at import time") from None
    finally:
        run.payload.unlink(missing_ok=True)
    run.out.seek(0)
    text = run.out.read()
    run.out.close()
    lines = text.rstrip().splitlines()
    try:
        errors = json.loads(lines[-1])["errors"]
    except (IndexError, ValueError, KeyError, TypeError):
        tail = "\n".join(lines[-20:])
        raise BuildError(f"importing the operator modules from the release's sources failed (exit status "
                         f"{run.proc.returncode}):\n{tail}") from None
    if errors:
        message, hint = errors[0]
        more = f" ({len(errors) - 1} more operators fail the same check)" if len(errors) > 1 else ""
        raise BuildError(f"the release would not load: {message}{more}", hint=hint)


def main(argv: list[str]) -> int:
    from tileship.errors import ArtifactLoadError, CompileForbidden
    from tileship.runtime import nojit
    from tileship.runtime.references import import_callable

    src, payload = argv[1], json.loads(Path(argv[2]).read_text())
    sys.path[:] = [src] + [p for p in sys.path if p not in ("", src)]  # as runtime.references.use_sources
    nojit.install()  # as a serving process: a compile on import is refused, and named
    errors: list[tuple[str, str | None]] = []
    for op, desc in sorted(payload.items()):
        for field, what in IMPORTED:
            if not desc.get(field):
                continue
            try:
                import_callable(desc[field], op, what, desc)
            except ArtifactLoadError as exc:
                plain = not isinstance(exc.__cause__, (CompileForbidden, ModuleNotFoundError))
                errors.append((exc.message, DATA_HINT if plain else exc.hint))
                break
    sys.stdout.flush()
    print("\n" + json.dumps({"errors": errors}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
