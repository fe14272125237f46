"""Repository parts the wheel does not ship, imported on demand by the commands that use them.

``pip install .`` installs ``src/tileship`` only. Two commands use code that lives beside it in
the source checkout:

    tileship serve --llama   examples/llama/          the random-weight Llama decoder (an example)
    tileship drill           benchmarks/drill_client.py  the drill's load generator (test tooling)

``import_extra`` imports such a module from ``sys.path`` (``PYTHONPATH``, or the current
directory under ``python -m``), else from the checkout this ``tileship`` was imported from (an
editable install or ``PYTHONPATH=src``), else raises ``MissingExtra`` naming the flag or command,
the file, and how to get it.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from tileship.errors import TileshipError

#: the source checkout's root when this package is ``<root>/src/tileship``, else None (an installed wheel)
_ROOT = Path(__file__).resolve().parents[2]
CHECKOUT: Path | None = (_ROOT if (_ROOT / "pyproject.toml").is_file() and (_ROOT / "src" / "tileship").is_dir()
                         else None)


class MissingExtra(TileshipError):
    """A command needs a part of the repository that is not installed (the wheel does not ship it)."""


def import_extra(module: str, *, needed_by: str, path: str) -> ModuleType:
    """Import ``module`` (e.g. ``examples.llama.serve``), found at ``path`` in the repository.

    ``needed_by`` names the flag or command that needs it (for the error). Raises MissingExtra
    when neither ``sys.path`` nor this package's source checkout holds it.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if not _is_missing(exc, module):
            raise  # the module is there but one of its own imports is not: report that as is
    if CHECKOUT is not None and (CHECKOUT / path).exists():
        if str(CHECKOUT) not in sys.path:
            sys.path.append(str(CHECKOUT))
        return importlib.import_module(module)
    raise MissingExtra(f"{needed_by} needs {module} ({path} in the tileship repository), "
                       "which `pip install` does not install",
                       hint=f"run it from a source checkout (`pip install -e .`, or PYTHONPATH=src), "
                            f"or put the checkout's root on PYTHONPATH so that `import {module}` works")


def llama_example() -> ModuleType:
    """``examples/llama/serve.py``: what ``tileship serve --llama`` serves (``parse_spec``, ``LlamaHost``)."""
    return import_extra("examples.llama.serve", needed_by="--llama", path="examples/llama/serve.py")


def drill_client() -> ModuleType:
    """``benchmarks/drill_client.py``: the load generator of ``tileship drill``."""
    return import_extra("benchmarks.drill_client", needed_by="tileship drill", path="benchmarks/drill_client.py")


def _is_missing(exc: ModuleNotFoundError, module: str) -> bool:
    """True when ``exc`` says ``module`` itself (or a package above it) is absent."""
    parts = module.split(".")
    return exc.name in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


__all__ = ["CHECKOUT", "MissingExtra", "drill_client", "import_extra", "llama_example"]
