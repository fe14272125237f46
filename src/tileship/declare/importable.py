"""A callable a release re-imports by its qualified name (the reference, the sample hook, the cost model)
must be importable that way: checked when the operator is described for the lock and the release.

A serving host imports ``module.qualname`` from the release's sources (``runtime.references``); a lambda, a
function defined inside another function (``<locals>``), a ``functools.partial`` or a callable object has no
such name, so a release holding one would build and then fail to load, verify or tune. ``qualified``
refuses them at build time with a ``DeclarationError`` naming the field (``double.reference``);
``check_arity`` refuses, when the operator is checked, one that cannot take the arguments tileship passes.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from typing import Any

from tileship.errors import DeclarationError

_HINT = "declare it as a function (def) at module level of an importable module, and pass that function"


def qualified(fn: Any, *, operator: str, field: str) -> str:
    """``module.qualname`` of ``fn``, after checking that importing it by that name gives ``fn`` back.
    Raises DeclarationError (``operator.field``) saying why it cannot be imported."""
    why: str | None
    module = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None)
    if isinstance(fn, functools.partial):
        why = "is a functools.partial, which has no name to import it by"
    elif not isinstance(module, str) or not isinstance(qual, str):
        why = f"is a {type(fn).__name__} with no __module__ and __qualname__ to import it by"
    elif "<lambda>" in qual:
        why = f"is a lambda ({module}.{qual}), which has no name to import it by"
    elif "<locals>" in qual:
        why = f"{module}.{qual} is defined inside a function, where an import cannot reach it"
    elif module == "__main__":
        why = f"{module}.{qual} is defined in __main__ (a script), which a release cannot import"
    else:
        why = _resolves(fn, module, qual)
    if why is None:
        return f"{module}.{qual}"
    raise DeclarationError(f"{why}: a release imports it by its qualified name", operator=operator, field=field,
                           hint=_HINT)


def _resolves(fn: Any, module: str, qual: str) -> str | None:
    """None when ``module.qual`` is ``fn``; else why not."""
    try:
        obj: Any = sys.modules.get(module) or importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 -- the user's module: any failure is the answer
        return f"its module {module} cannot be imported ({type(exc).__name__}: {exc})"
    for part in qual.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            return f"{module}.{qual} is not reachable: {module} has no attribute path {qual}"
    if obj is fn or obj == fn or inspect.unwrap(obj) is inspect.unwrap(fn):
        return None
    return f"{module}.{qual} names another object than the one declared (renamed or rebound after the declaration)"


_MISSING = object()


def check_arity(fn: object, args: list[str], op: str, field_name: str, hint: str) -> None:
    """A callable tileship calls with ``args`` positionally must accept them: a reference that takes two
    arguments for three inputs would build, then fail at the first call the kernel does not serve."""
    try:
        sig = inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a builtin without a signature: nothing to hold it to
        return
    try:
        sig.bind(*args)
    except TypeError as exc:
        fname = getattr(fn, "__qualname__", type(fn).__name__)
        raise DeclarationError(f"{fname}{sig} cannot be called with the {len(args)} arguments tileship passes "
                               f"({', '.join(args)}): {exc}", operator=op, field=field_name, hint=hint) from None


__all__ = ["check_arity", "qualified"]
