"""What the docs say lives in a module lives there, and one helper is written once: read from the tree's files."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
SRC = ROOT / "src" / "tileship"

#: "`NAME` in `package/module.py`", across a line break
NAMED_IN = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`\s+in\s+`((?:[a-z_]+/)*[a-z_]+\.py)`")


def _defined(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_a_name_the_docs_place_in_a_module_is_defined_there():
    """docs/serving.md placed ``STICKY_CUDA_ERRORS`` in ``serve/app.py``; it is in ``runtime/device_faults.py``."""
    wrong = []
    for doc in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        for m in NAMED_IN.finditer(doc.read_text()):
            name, module = m.groups()
            path = SRC / module
            if not path.is_file() or name not in _defined(path):
                wrong.append(f"{doc.name}: `{name}` in `{module}`")
    assert not wrong, wrong


def test_directories_are_fsynced_by_one_helper():
    """``release/keys.py`` and ``release/atomic_file.py`` each carried their own ``_fsync_dir``, a copy of
    ``release/nofollow.fsync_dir``."""
    copies = [str(p.relative_to(SRC)) for p in sorted(SRC.rglob("*.py"))
              if p.name != "nofollow.py" and any("fsync_dir" in n for n in _defined(p))]
    assert not copies, copies
