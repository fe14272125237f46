"""Candidates: the configs an operator is built with when it has more than one (Option B).

An operator declares them as an explicit list, as a ``Space`` (a product of axes with an
optional ``valid(config)`` filter), or as ``"factory"``: reuse the ``configs`` of the
factory's own TileLang ``@autotune`` decorator. Each candidate is a partial config laid over
``Operator.config``; its id names it readably (``block_M64-block_N128-num_stages3``) and
becomes the last part of the specialization id, so every candidate is its own artifact.

An operator with no candidates builds one kernel per shape from ``Operator.config``, exactly as
before, and its specialization ids carry no candidate part.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tileship.errors import DeclarationError

#: the ``candidates=`` value that reuses the factory's ``@autotune(configs=...)``
FROM_FACTORY = "factory"
#: most candidates one operator may declare (a typo in a Space should not queue 10^5 compiles)
MAX_CANDIDATES = 256
_VALUE = (int, float, str, bool)


class Space:
    """A search space: every combination of the axes' values, kept when ``valid(config)`` is true.

    ``Space(block_M=[64, 128], block_N=[64, 128, 256], num_stages=[2, 3], valid=lambda c: ...)``.
    Axes expand in the order written, last axis fastest, so the candidate order is stable.
    """

    def __init__(self, valid: Callable[[dict[str, Any]], bool] | None = None, **axes: Sequence[Any]) -> None:
        self.axes = {k: tuple(v) if isinstance(v, (list, tuple, range)) else (v,) for k, v in axes.items()}
        self.valid = valid

    def configs(self) -> list[dict[str, Any]]:
        keys = list(self.axes)
        out = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*self.axes.values())]
        return [c for c in out if self.valid is None or self.valid(dict(c))]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Space) and self.axes == other.axes and self.valid is other.valid

    def __hash__(self) -> int:
        return hash(tuple(self.axes))

    def __repr__(self) -> str:
        return f"Space({', '.join(f'{k}={list(v)}' for k, v in self.axes.items())})"


def candidate_id(config: Mapping[str, Any]) -> str:
    """A readable, path-safe id of a partial config: ``block_M64-num_stages3``; ``default`` when empty."""
    if not config:
        return "default"
    parts = []
    for k, v in config.items():
        text = str(int(v)) if isinstance(v, bool) else str(v)
        parts.append(re.sub(r"[^A-Za-z0-9_]", "_", f"{k}{text.replace('.', 'p').replace('-', 'm')}"))
    return "-".join(parts)


def factory_configs(factory: Any, operator: str) -> list[dict[str, Any]]:
    """The configs of a factory's own ``@autotune`` decorator: a list of dicts, or a dict of
    lists (their product). Raises DeclarationError when there are none or they are a callable
    (those depend on call arguments the declaration does not have)."""
    configs = getattr(factory, "configs", None) if hasattr(factory, "jit_impl") else None  # an AutoTuneImpl
    hint = "declare candidates=[{...}, ...] or candidates=Space(...) instead"
    if configs is None:
        raise DeclarationError(
            'candidates="factory" needs an @autotune(configs=...) factory',
            operator=operator,
            field="candidates",
            hint=hint,
        )
    if callable(configs):
        raise DeclarationError(
            "the factory's autotune configs are a callable of the call's arguments",
            operator=operator,
            field="candidates",
            hint=hint,
        )
    if isinstance(configs, Mapping):
        return Space(**configs).configs()
    return [dict(c) for c in configs]


def resolve_candidates(op: Any) -> list[tuple[str, dict[str, Any]]]:
    """``[(candidate id, partial config), ...]`` in declaration order; ``[]`` for an operator without
    candidates. Raises DeclarationError naming the bad candidate."""
    raw = op.candidates
    if raw is None or (isinstance(raw, (tuple, list)) and not raw):
        return []
    if isinstance(raw, str):
        if raw != FROM_FACTORY:
            raise DeclarationError(
                f'must be a list of configs, a Space or "{FROM_FACTORY}", got {raw!r}',
                operator=op.name,
                field="candidates",
            )
        configs = factory_configs(op.factory, op.name)
    elif isinstance(raw, Space):
        configs = raw.configs()
    elif isinstance(raw, (tuple, list)):
        configs = list(raw)
    else:
        raise DeclarationError(
            f"must be a list of configs or a Space, got {type(raw).__name__}", operator=op.name, field="candidates"
        )
    if not configs:
        raise DeclarationError(
            "the candidate set is empty (the Space's valid() keeps nothing)", operator=op.name, field="candidates"
        )
    if len(configs) > MAX_CANDIDATES:
        raise DeclarationError(
            f"{len(configs)} candidates, at most {MAX_CANDIDATES}",
            operator=op.name,
            field="candidates",
            hint="narrow the Space or filter it with valid=",
        )
    out: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    for i, c in enumerate(configs):
        if not isinstance(c, Mapping):
            raise DeclarationError(
                f"must be a dict of config values, got {type(c).__name__}", operator=op.name, field=f"candidates[{i}]"
            )
        for k, v in c.items():
            if not isinstance(k, str) or not isinstance(v, _VALUE):
                raise DeclarationError(
                    f"{k!r}: config values must be int/float/str/bool, got {type(v).__name__}",
                    operator=op.name,
                    field=f"candidates[{i}].{k}",
                )
        cid = candidate_id(c)
        if cid in seen:
            raise DeclarationError(
                f"same config as candidates[{seen[cid]}] ({cid})", operator=op.name, field=f"candidates[{i}]"
            )
        seen[cid] = i
        out.append((cid, dict(c)))
    return out
