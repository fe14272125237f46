"""Issue 10's size rules for the package, checked in CI: modules of one job stay under 350 lines,
and no line is over 120 characters (the ruff setting, which CI does not run; as in ruff, a trailing
``# type: ignore[...]`` or ``# noqa`` pragma does not count)."""

from __future__ import annotations

import re
from pathlib import Path

import tileship

SRC = Path(tileship.__file__).resolve().parent
MAX_LINES = 350
MAX_WIDTH = 120
PRAGMA = re.compile(r"\s*# (type: ignore|noqa)\b.*$")


def _modules() -> list[Path]:
    mods = sorted(SRC.rglob("*.py"))
    assert len(mods) > 100, f"found only {len(mods)} modules under {SRC}"
    return mods


def test_no_module_is_over_350_lines() -> None:
    long = {str(p.relative_to(SRC)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these along their seams: {long}"


def test_no_line_is_over_120_characters() -> None:
    wide = [f"{p.relative_to(SRC)}:{i}" for p in _modules()
            for i, line in enumerate(p.read_text().splitlines(), 1) if len(PRAGMA.sub("", line)) > MAX_WIDTH]
    assert not wide, f"lines over {MAX_WIDTH} characters: {wide[:20]}"
