"""Put a release's kernels into an existing ``nn.Module`` model, and make the model know it.

``swap(model, release)`` replaces, in place:

    nn.Linear                     -> KernelLinear     (gemm: A(M,K) @ B(K,N); y = x W^T + b)
    RMSNorm (torch or llama's)    -> KernelRMSNorm    (rmsnorm: X(M,N), W(N))
    llama.CausalSelfAttention     -> KernelAttention  (attention: causal, Q/K/V (B,H,S,D))

where the release declares a specialization for the layer's fixed dims and dtype (the
GEMM's N and K, the norm's N and eps, the attention's H and D). Everything else stays on
its PyTorch path, and the returned ``SwapReport`` says which layers were replaced and why
the others were not. A replaced layer still decides per call: sizes no specialization
covers (a batch past the dynamic range, a sequence length not built) go to the reference
through the dispatcher, with its reason and counters.

The model carries the kernels it runs: ``model.tileship_kernels`` (a ``KernelStamp``) names
the release id and kernel revision, and is saved in the ``state_dict`` as
``tileship_kernels._extra_state``. Loading a checkpoint stamped with other kernels raises
``KernelMismatch`` unless ``allow_kernel_mismatch=True``; an unstamped checkpoint (the
plain PyTorch model's weights) loads into a swapped model as is: weights do not depend
on kernels. State-dict keys of replaced layers are unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from tileship.errors import DeclarationError, KernelMismatch
from tileship.runtime.dispatch import Entry, Release
from tileship.torchops.custom_ops import TorchOps, register
from tileship.torchops.kernel_layers import KernelAttention, KernelLinear, KernelRMSNorm
from tileship.torchops.layers import CausalSelfAttention, RMSNorm
from tileship.torchops.report import SwapRecord, SwapReport
from tileship.torchops.stamp import (
    FILE_FORMAT,
    STAMP,
    KernelStamp,
    _unwrap,
    check_stamp,
    kernel_stamp,
    load,
    load_state_dict,
    save,
)

#: layer kind -> release operator serving it (override per call with ``names=``)
DEFAULT_NAMES: Mapping[str, str] = {"linear": "gemm", "rmsnorm": "rmsnorm", "attention": "attention"}
#: layer kind -> (input ranks, the signature a reader expects)
_SIGNATURES: Mapping[str, tuple[tuple[int, ...], str]] = {
    "linear": ((2, 2), "A(M, K), B(K, N) -> C(M, N), or F.linear's X(M, K), W(N, K) -> Y(M, N)"),
    "rmsnorm": ((2, 1), "X(M, N), W(N) -> Y(M, N)"),
    "attention": ((4, 4, 4), "Q, K, V (B, H, S, D) -> O(B, H, S, D), causal"),
}


_KERNEL_TYPES = {KernelLinear: "linear", KernelRMSNorm: "rmsnorm", KernelAttention: "attention"}
#: layer types whose forward is ``F.rms_norm`` / causal SDPA: their swapped layers serve reference-routed
#: keys with that same call (``kernel_layers._Bypassing``)
_NATIVE_NORMS = (nn.RMSNorm, RMSNorm)
_NATIVE_ATTENTION = (CausalSelfAttention,)


# -- swap -------------------------------------------------------------------------------
def swap(model: nn.Module, release: Release, *, names: Mapping[str, str] | None = None,
         dtype: torch.dtype | None = None,
         rmsnorm_types: tuple[type, ...] | None = None, attention_types: tuple[type, ...] | None = None,
         serving_only: bool = False) -> SwapReport:
    """Replace the layers of ``model`` the release covers (in place); return the report.

    ``names`` maps a layer kind (linear, rmsnorm, attention) to the release operator serving it
    (default ``DEFAULT_NAMES``); ``dtype`` is the dtype attention runs in (default: the
    model's first floating parameter's). Only exact ``nn.Linear`` instances are replaced:
    a subclass may behave differently and is reported as kept. The model is stamped
    (``model.tileship_kernels``) when at least one layer was replaced. Raises DeclarationError when
    a named operator lacks the kind's signature, KernelMismatch when the model already runs
    another release's kernels. Calling it again with the same release is a no-op.

    ``serving_only``: also keep a covered layer on PyTorch when every specialization covering it
    serves the reference at swap time (slower than the reference on this GPU, unverified, disabled):
    swapped, it would pay the dispatcher's host time on every call and launch the same PyTorch
    code. The decisions are the release's at swap time; a layer kept this way stays on PyTorch when
    they change later (swap a fresh copy of the model after a reload).
    """
    root = _unwrap(model)
    stamp = kernel_stamp(root)
    if stamp is not None and stamp.release_id != release.release_id:
        raise KernelMismatch(f"the model already runs kernels of release {stamp.release_id}", expected=stamp.to_json(),
                             found={"release_id": release.release_id, "kernel_revision": release.kernel_revision},
                             hint="swap a fresh copy of the PyTorch model")
    chosen = {**DEFAULT_NAMES, **(names or {})}
    unknown = set(chosen) - set(_SIGNATURES)
    if unknown:
        raise DeclarationError(f"unknown layer kinds {sorted(unknown)} (known: {sorted(_SIGNATURES)})", field="names")
    norm_types = rmsnorm_types if rmsnorm_types is not None else _NATIVE_NORMS
    attn_types = attention_types if attention_types is not None else _NATIVE_ATTENTION
    ops = register(release)
    for kind, op_name in chosen.items():
        if op_name in release.ops:
            _check_signature(release, kind, op_name)
    if dtype is None:
        dtype = next((p.dtype for p in root.parameters() if p.is_floating_point()), torch.float32)
    records: list[SwapRecord] = []
    used: set[str] = set(stamp.operators) if stamp is not None else set()
    for path, module in list(root.named_modules()):
        if not path or isinstance(module, KernelStamp):
            continue
        if type(module) in _KERNEL_TYPES:
            kind = _KERNEL_TYPES[type(module)]
            records.append(SwapRecord(path, kind, True, chosen[kind], "already swapped"))
            continue
        if isinstance(module, nn.Linear):
            rec, new = _linear(path, module, release, ops, chosen["linear"])
        elif isinstance(module, norm_types):
            rec, new = _rmsnorm(path, module, release, ops, chosen["rmsnorm"])
        elif isinstance(module, attn_types):
            rec, new = _attention(path, module, release, ops, chosen["attention"], dtype)
        else:
            continue
        if serving_only and new is not None and "kernel" not in rec.serving:
            rec = SwapRecord(path, rec.kind, False, rec.operator,
                             f"{rec.operator} covers it, but every covering specialization serves the reference now "
                             f"({', '.join(rec.serving)}): swapped, it would only add the dispatcher's host time "
                             f"(serving_only)", rec.specs, rec.serving)
            new = None
        records.append(rec)
        if new is not None:
            _set_submodule(root, path, new)
            used.add(rec.operator or "")
    if used and stamp is None:  # a model with nothing replaced runs no kernels: no stamp
        stamp = KernelStamp(release.release_id, release.kernel_revision, ())
        setattr(root, STAMP, stamp)
    if stamp is not None:
        stamp.operators = tuple(sorted(used))
    return SwapReport(release.release_id, release.kernel_revision, tuple(records))


def _linear(path: str, m: nn.Linear, release: Release, ops: TorchOps,
            op_name: str) -> tuple[SwapRecord, nn.Module | None]:
    if type(m) is not nn.Linear:
        return SwapRecord(path, "linear", False, None,
                          f"{type(m).__name__} subclasses nn.Linear and may behave differently"), None
    nn_layout = _nn_layout(release, op_name)
    where = ((1, 1, m.in_features), (1, 0, m.out_features)) if nn_layout else \
        ((1, 0, m.in_features), (1, 1, m.out_features))
    return _cover(path, "linear", release, ops, op_name, m.weight.dtype, where,
                  lambda op: KernelLinear(m, op, nn_layout=nn_layout))


def _nn_layout(release: Release, op_name: str) -> bool:
    """True when ``op_name`` takes its weight in ``F.linear``'s layout: the second input's last dim is
    the first input's (``X(M, K), W(N, K)``), so ``nn.Linear.weight`` is passed as it is."""
    if op_name not in release.ops:
        return False
    inputs = release.declarations[op_name]["inputs"]
    return list(inputs[1][1])[1] == list(inputs[0][1])[1]


def _rmsnorm(path: str, m: Any, release: Release, ops: TorchOps, op_name: str) -> tuple[SwapRecord, nn.Module | None]:
    weight = getattr(m, "weight", None)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 1:
        return SwapRecord(path, "rmsnorm", False, None,
                          "no 1-D weight (elementwise_affine off, or normalizes over more than the last dim)"), None
    eps = getattr(m, "eps", None)
    if eps is None:  # nn.RMSNorm(eps=None) uses the dtype's machine epsilon
        eps = torch.finfo(weight.dtype).eps
    if op_name in release.ops:
        want = release.declarations[op_name].get("config", {}).get("eps")
        if want is None:
            return SwapRecord(path, "rmsnorm", False, op_name,
                              f"{op_name} declares no eps in its config: cannot tell it matches {eps:g}"), None
        if float(want) != float(eps):
            return SwapRecord(path, "rmsnorm", False, op_name,
                              f"eps {eps:g} differs from the kernel's {float(want):g}"), None
    return _cover(path, "rmsnorm", release, ops, op_name, weight.dtype, ((1, 0, weight.shape[0]),),
                  lambda op: KernelRMSNorm(weight, float(eps), op, native=type(m) in _NATIVE_NORMS))


def _attention(path: str, m: Any, release: Release, ops: TorchOps, op_name: str,
               dtype: torch.dtype) -> tuple[SwapRecord, nn.Module | None]:
    h, d = getattr(m, "n_heads", None), getattr(m, "head_dim", None)
    if not isinstance(h, int) or not isinstance(d, int):
        return SwapRecord(path, "attention", False, None, "the module does not say its n_heads and head_dim"), None
    return _cover(path, "attention", release, ops, op_name, dtype, ((0, 1, h), (0, 3, d)),
                  lambda op: KernelAttention(h, d, op, native=type(m) in _NATIVE_ATTENTION))


def _cover(path: str, kind: str, release: Release, ops: TorchOps, op_name: str, dtype: torch.dtype,
           where: tuple[tuple[int, int, int], ...], make: Any) -> tuple[SwapRecord, nn.Module | None]:
    """``where``: the layer's fixed dims as (declared input index, dim position, size)."""
    if op_name not in release.ops:
        return SwapRecord(path, kind, False, None,
                          f"the release has no {op_name!r} operator (it has: {', '.join(sorted(release.ops))})"), None
    decl_inputs = release.declarations[op_name]["inputs"]
    fixed = {decl_inputs[i][1][pos]: size for i, pos, size in where}
    dt = str(dtype).removeprefix("torch.")
    runner = release.ops[op_name]
    same_dtype = [(e, e.spec) for e in runner.entries if e.spec is not None and e.spec.dtype == dt]
    matched = [(e, s) for e, s in same_dtype if all(_holds(s.dim_map().get(d), v) for d, v in fixed.items())]
    want = ", ".join(f"{d}={v}" for d, v in fixed.items())
    if not same_dtype:
        have = sorted({e.spec.dtype for e in runner.entries if e.spec is not None})
        return SwapRecord(path, kind, False, op_name,
                          f"no {op_name} specialization in {dt} (the release has {', '.join(have) or 'none'})"), None
    if not matched:
        have = sorted({", ".join(f"{d}={_show(s.dim_map()[d])}" for d in fixed) for _, s in same_dtype})
        return SwapRecord(path, kind, False, op_name,
                          f"no {op_name} specialization for {want} in {dt} (the release has: {'; '.join(have)})"), None
    specs = tuple(e.decision.spec_id or s.id for e, s in matched)  # the release's id (its directory)
    serving = tuple(sorted({_serving(e) for e, _ in matched}))
    reason = (f"{op_name} covers {want} in {dt} ({len(specs)} specialization{'s' if len(specs) > 1 else ''}; "
              f"now serving {', '.join(serving)})")
    return SwapRecord(path, kind, True, op_name, reason, specs, serving), make(ops.eager(op_name))


def _check_signature(release: Release, kind: str, op_name: str) -> None:
    ranks, shown = _SIGNATURES[kind]
    decl = release.declarations[op_name]
    got = tuple(len(dims) for _, dims, *_ in decl["inputs"])
    if got != ranks or len(decl["outputs"]) != 1:
        sig = ", ".join(f"{n}({', '.join(d)})" for n, d, *_ in decl["inputs"])
        raise DeclarationError(f"operator {op_name!r} is declared ({sig}) -> {len(decl['outputs'])} outputs; a {kind} "
                               f"layer needs {shown}",
                               operator=op_name, field="names",
                               hint=f"pass names={{'{kind}': '<operator with that signature>'}}")


def _holds(declared: Any, size: int) -> bool:
    if isinstance(declared, tuple):
        return declared[0] <= size <= declared[1]
    return declared == size


def _show(v: Any) -> str:
    return f"{v[0]}..{v[1]}" if isinstance(v, tuple) else str(v)


def _serving(e: Entry) -> str:
    return e.decision.path if e.decision.path == "kernel" else f"{e.decision.path}:{e.decision.reason}"


def _set_submodule(root: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    setattr(parent, name, new)


__all__ = ["DEFAULT_NAMES", "FILE_FORMAT", "KernelAttention", "KernelLinear", "KernelRMSNorm",
           "KernelStamp", "SwapRecord",
           "SwapReport", "check_stamp", "kernel_stamp", "load", "load_state_dict", "save", "swap"]
