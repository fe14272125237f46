"""Checking an ``Operator``'s kernel factory against its declaration: ``config`` values, the ``params``
mapping, each factory keyword given one value, and the factory's signature taking every keyword the
declaration passes (dims, the operator dtype, config and candidate keys) and none it requires left out.

``check_factory`` (the last step of ``declare.checks.check_operator``) raises ``DeclarationError`` naming the
first bad field, with a hint where the fix is mechanical. It imports neither TileLang nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tileship.errors import DeclarationError

if TYPE_CHECKING:
    from tileship.declare.spec import Operator


def check_factory(decl: Operator, op: str) -> None:
    """Raise DeclarationError naming the first bad ``config``/``params`` field, or the keyword the factory's
    signature lacks or requires; return None when the factory takes what the declaration passes."""
    from tileship.declare.factory import resolve

    info = resolve(decl.factory, operator=op)
    for d, v in decl.config.items():
        if not isinstance(v, (int, float, str, bool)):
            raise DeclarationError(
                f"config values must be int/float/str/bool, got {type(v).__name__}", operator=op, field=f"config.{d}"
            )
    for key, target in decl.params.items():
        if key != "dtype" and key not in decl.dims:
            raise DeclarationError(
                f'{key!r} is not a declared dim (dims: {", ".join(decl.dims)}) nor "dtype"',
                operator=op,
                field=f"params.{key}",
                hint='map a declared dim or "dtype" to the factory\'s parameter name',
            )
        if target is None and key != "dtype":
            raise DeclarationError(
                f"dim {key} must be passed to the factory",
                operator=op,
                field=f"params.{key}",
                hint=f'map it to the factory parameter that takes it, e.g. params={{"{key}": "{key.lower()}"}}',
            )
        several = key == "dtype" and isinstance(target, (tuple, list))
        if several and (not target or not all(isinstance(t, str) for t in target) or len(set(target)) != len(target)):
            raise DeclarationError(
                f"must name each factory parameter once, got {target!r}", operator=op, field="params.dtype",
                hint='e.g. params={"dtype": ("in_dtype", "out_dtype")} when both take the operator dtype',
            )
        if target is not None and not isinstance(target, str) and not several:
            raise DeclarationError(
                f"must be a parameter name or None, got {type(target).__name__}", operator=op, field=f"params.{key}",
                hint='a dim takes one parameter name; "dtype" also takes a tuple of them' if key != "dtype" else
                'a parameter name, a tuple of them (params={"dtype": ("in_dtype", "out_dtype")}) or None',
            )
    if not decl.dtype_params() and len(decl.dtypes) > 1:
        raise DeclarationError(
            f"passes no dtype to the factory, but dtypes lists {len(decl.dtypes)}: "
            "every build would be the same kernel",
            operator=op,
            field="params.dtype",
            hint=f'declare dtypes=("{decl.dtypes[0]}",) or map dtype to a parameter',
        )
    sig = info.signature
    if sig is None:
        return
    accepts_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    fname = info.qualname.rpartition(".")[2]
    givers = [(f"params.{d}" if d in decl.params else "params", decl.factory_param(d), f"dim {d}") for d in decl.dims]
    givers += [("params.dtype" if "dtype" in decl.params else "dtype_param", p, "the operator dtype")
               for p in decl.dtype_params() or (None,)]
    givers += [(f"config.{k}", k, f"config[{k!r}]") for k in decl.config]
    _check_collisions(op, givers)
    wanted = [(field_name, name) for field_name, name, _ in givers]
    for cid, cfg in decl.candidate_configs():
        wanted += [(f"candidates.{cid}.{k}", k) for k in cfg if k not in decl.config]
    # an eager kernel's dims are its T.const names, passed as keywords its signature does not list (a name
    # the body never declares is refused by the trace); config keys and the dtype stay real parameters
    consts = {decl.factory_param(d) for d in decl.dims} if info.tensor_params else set()
    for field_name, name in wanted:
        if name is not None and name not in sig.parameters and not accepts_kw and name not in consts:
            known = ", ".join(sig.parameters)
            hint = (
                'map it: params={"dtype": "<the dtype parameter>"}, '
                'or params={"dtype": None} when the factory hard-codes it'
                if field_name in ("dtype_param", "params.dtype")
                else f'rename it with params={{...: "<parameter>"}} (the factory takes: {known})'
            )
            raise DeclarationError(
                f"factory {fname}() ({info.form}) has no parameter {name!r} (it takes: {known})",
                operator=op,
                field=field_name,
                hint=hint,
            )
    required = [
        p.name
        for p in sig.parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in info.tensor_params  # bound by TileLang from the tensor annotations, never passed
    ]
    given = {n for _, n in wanted if n is not None}
    missing = [n for n in required if n not in given]
    if missing:
        raise DeclarationError(
            f"factory {fname}() requires {missing} that the declaration never passes",
            operator=op,
            field="config",
            hint="add them to config={...} or map a dim to them with params=",
        )


def _check_collisions(op: str, givers: list[tuple[str, str | None, str]]) -> None:
    """Each factory keyword receives one value: a dim named like the dtype parameter (``("dtype",)``) or
    like a config key would be passed twice. ``givers``: (field, factory keyword or None, what it passes)."""
    seen: dict[str, str] = {}
    for field_name, name, who in givers:
        if name is None:
            continue
        if name in seen:
            raise DeclarationError(
                f"the factory parameter {name!r} would receive both {seen[name]} and {who}",
                operator=op,
                field=field_name,
                hint="rename the dim, or map each to its own factory parameter with params={...}",
            )
        seen[name] = who
