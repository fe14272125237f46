"""The sequence-typed fields of an ``Operator`` (``inputs``, ``outputs``, ``dtypes``, ...): a list is
taken as the tuple it spells, anything else that is not a tuple is refused with the fix.

``normalise`` runs when an ``Operator`` is made (a list becomes a tuple, so the declaration hashes,
compares and concatenates as written); ``check`` is the first check of ``Operator.check`` and raises
``DeclarationError`` for a single item without its tuple (``inputs=TensorArg(...)``), a string
(``dtypes="float32"``, which would otherwise be read letter by letter) or any other type.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tileship.declare.parts import DynamicRange, ScalarArg, TensorArg
from tileship.errors import DeclarationError

#: field -> (what one item is, an example of the field)
FIELDS: dict[str, tuple[str, str]] = {
    "inputs": ("TensorArg or ScalarArg", 'inputs=(TensorArg("A", ("N",)),)'),
    "outputs": ("TensorArg", 'outputs=(TensorArg("C", ("N",)),)'),
    "dtypes": ("dtype name", 'dtypes=("float32",)'),
    "targets": ("target name", 'targets=("c",)'),
    "shapes": ("{dim: size} mapping", 'shapes=({"N": 128},)'),
    "ranges": ("DynamicRange", 'ranges=(DynamicRange("N", 1, 4096),)'),
    "mutates": ("input name", 'mutates=("k_cache",)'),
}
_ITEMS = (TensorArg, ScalarArg, DynamicRange, Mapping)


def normalise(op: Any) -> None:
    """Replace every list among ``op``'s sequence fields by its tuple (``op`` is frozen: set in place)."""
    for name in FIELDS:
        value = getattr(op, name)
        if isinstance(value, list):
            object.__setattr__(op, name, tuple(value))


def check(op: Any, operator: str) -> None:
    """Raise DeclarationError naming the first sequence field of ``op`` that is not a tuple."""
    for name, (what, example) in FIELDS.items():
        value = getattr(op, name)
        if isinstance(value, tuple):
            continue
        if isinstance(value, str):
            raise DeclarationError(f"must be a tuple of {what}s, got the string {value!r}", operator=operator,
                                   field=name, hint=f'write {name}=("{value}",) (note the comma)')
        if isinstance(value, _ITEMS):
            kind = "mapping" if isinstance(value, Mapping) else type(value).__name__
            raise DeclarationError(f"must be a tuple of {what}s, got a single {kind}", operator=operator, field=name,
                                   hint=f"wrap it in a tuple: {name}=({value!r},) (note the comma)")
        raise DeclarationError(f"must be a tuple (or a list) of {what}s, got {type(value).__name__}",
                               operator=operator, field=name, hint=f"e.g. {example}")


__all__ = ["FIELDS", "check", "normalise"]
