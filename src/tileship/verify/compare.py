"""Output vs reference: NaN poisoning of outputs and the element-wise atol/rtol check, in one place."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tileship.verify.timing import _num

#: the poison of each dtype, as (integer view, bits): for floats NaN payloads nothing computes
#: (canonical NaNs are 0x7FC00000 / 0xFFC00000 and friends), for ints and bool a sentinel byte
#: pattern (0x5A...; a bool holding 0x5A is neither True nor False as a kernel writes them)
POISON_BITS = {"float32": ("int32", 0x7FC0DEAD), "float16": ("int16", 0x7E6D), "bfloat16": ("int16", 0x7FED),
               "float64": ("int64", 0x7FF80000DEADBEEF), "int64": ("int64", 0x5A5A5A5A5A5A5A5A),
               "int32": ("int32", 0x5A5A5A5A),
               "int16": ("int16", 0x5A5A), "int8": ("int8", 0x5A), "uint8": ("uint8", 0x5A), "bool": ("uint8", 0x5A),
               # e4m3fn has a single NaN pattern (0x7F; 0xFF with the sign): a kernel writing NaN reads as unwritten
               "float8_e4m3fn": ("uint8", 0x7F), "float8_e5m2": ("uint8", 0x7D)}


@dataclass(frozen=True)
class Check:
    """One output of one run compared with the float64 reference."""

    numel: int
    unwritten: int
    nonfinite: int
    mismatches: int
    max_abs_err: float | None
    rel_l2_err: float | None
    #: worst element's |err| / (atol + rtol |ref|): <= 1 passes
    tol_ratio: float | None
    failure: str | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None

    def to_json(self) -> dict[str, Any]:
        return {k: _num(v) for k, v in self.__dict__.items()}


def _poison_pattern(dtype: Any) -> tuple[Any, int]:
    """(integer view dtype, poison bits as a value of that dtype) for any declared dtype."""
    import torch

    view, bits = POISON_BITS[str(dtype).removeprefix("torch.")]
    info = torch.iinfo(getattr(torch, view))
    return getattr(torch, view), bits - (1 << info.bits) if bits > info.max else bits


def fill_poison(t: Any) -> Any:
    """Fill ``t`` in place with the poison bit pattern of its dtype. Returns ``t``."""
    view, signed = _poison_pattern(t.dtype)
    t.view(view).fill_(signed)
    return t


def poison_mask(t: Any) -> Any:
    """Elements of ``t`` still bit-identical to the poison (never written)."""
    view, signed = _poison_pattern(t.dtype)
    return t.contiguous().view(view) == signed


def poisoned_call(kernel: Callable[..., Any], args: Sequence[Any],
                  outputs: Sequence[tuple[tuple[int, ...], Any]], *, mutated: int = 0) -> tuple[list[Any], bool]:
    """Run ``kernel(*args)`` with every output it allocates pre-filled with the poison.

    ``outputs``: (shape, torch dtype) of each output, for the CUDA allocator. Returns the
    outputs (``[]`` for a kernel returning None) and whether each was confirmed to be a poisoned
    block; the last ``mutated`` results are inputs updated in place (``verify.mutated.OnClones``),
    caller-owned, so not checked. Raises what the kernel raises; on CUDA synchronizes, so a launch
    error surfaces here.
    """
    import torch

    device = next(a for a in args if torch.is_tensor(a)).device
    made: list[Any] = []
    real_empty = torch.empty

    def poisoned_empty(*size: Any, **kw: Any) -> Any:
        t = real_empty(*size, **kw)
        if str(t.dtype).removeprefix("torch.") in POISON_BITS and t.numel():
            fill_poison(t)
            made.append(t)
        return t

    handed_back: set[int] = set()
    if device.type == "cuda":
        # Same requests, freed in reverse: the allocator state is as before, so the kernel's
        # identical requests get these very blocks back (contents survive a free).
        blocks = [fill_poison(real_empty(shape, dtype=dt, device=device)) for shape, dt in outputs]
        handed_back = {b.data_ptr() for b in blocks}
        while blocks:
            del blocks[-1]
    torch.empty = poisoned_empty
    try:
        result = kernel(*args)
    finally:
        torch.empty = real_empty
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    outs = [] if result is None else list(result) if isinstance(result, (list, tuple)) else [result]
    ours = {t.data_ptr() for t in made} | handed_back
    return outs, all(o.data_ptr() in ours for o in outs[:len(outs) - mutated])


#: elements compared at a time: the float64 temporaries of one chunk take about 1 GiB, whatever the output's
#: size (a whole 8192 x 128256 output took about 10 float64 copies of itself, 84 GiB, and ran an 80 GB H100 out of
#: memory, round 29)
CHUNK = 1 << 24


def check_output(out: Any, ref: Any, *, atol: float, rtol: float) -> Check:
    """Compare ``out`` with the high-precision ``ref`` element by element, ``CHUNK`` elements at a time.
    Running out of device memory while comparing is a failed check that says so, never an exception."""
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return Check(int(out.numel()), 0, 0, 0, None, None, None,
                     failure=f"output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    try:
        return _check_chunks(out, ref, atol, rtol)
    except torch.OutOfMemoryError as exc:
        return Check(int(ref.numel()), 0, 0, 0, None, None, None,
                     failure=f"comparing the output with the reference ran out of device memory "
                             f"({str(exc).splitlines()[0][:160]}): not verified on this device")


def _check_chunks(out: Any, ref: Any, atol: float, rtol: float) -> Check:
    import torch

    numel = int(ref.numel())
    poisoned = str(out.dtype).removeprefix("torch.") in POISON_BITS
    flat_o, flat_r = out.reshape(-1), ref.reshape(-1)
    ref_bad = n_unw = n_nf = n_mis = 0
    first_unw = first_nf = mis = None
    max_abs = tol_ratio = None
    sq_diff = sq_ref = 0.0
    for start in range(0, numel, CHUNK):
        oc = flat_o[start:start + CHUNK]
        unwritten = poison_mask(oc) if poisoned else torch.zeros(oc.shape, dtype=torch.bool, device=oc.device)
        o = oc.to(torch.float64)
        r = flat_r[start:start + CHUNK].to(device=oc.device, dtype=torch.float64)
        ref_bad += int((~torch.isfinite(r)).sum())
        nonfinite = ~torch.isfinite(o) & ~unwritten
        err = (o - r).abs()
        bound = atol + rtol * r.abs()
        finite = torch.isfinite(o) & torch.isfinite(r)
        mismatches = finite & ~(err <= bound)  # False for NaN
        k_unw, k_nf, k_mis = int(unwritten.sum()), int(nonfinite.sum()), int(mismatches.sum())
        if k_unw and first_unw is None:
            first_unw = start + _first(unwritten)
        if k_nf and first_nf is None:
            first_nf = start + _first(nonfinite)
        if k_mis and mis is None:
            at = _first(mismatches)
            mis = (start + at, o[at].item(), r[at].item())
        n_unw, n_nf, n_mis = n_unw + k_unw, n_nf + k_nf, n_mis + k_mis
        if bool(finite.any()):
            e, rf = err[finite], r[finite]
            max_abs = max(max_abs or 0.0, float(e.max()))
            sq_diff += float((e * e).sum())
            sq_ref += float((rf * rf).sum())
            ratio = torch.where(bound > 0, err / bound.clamp_min(1e-300), torch.where(err > 0, math.inf, 0.0))
            tol_ratio = max(tol_ratio or 0.0, float(ratio[finite].max()))
        del unwritten, o, r, nonfinite, err, bound, finite, mismatches
    rnorm = math.sqrt(sq_ref)
    rel_l2 = math.sqrt(sq_diff) / rnorm if rnorm > 0 else None
    failure = None
    if ref_bad:
        failure = f"the reference produced {ref_bad} non-finite values: the inputs are outside the operator's domain"
    elif n_unw:
        failure = (f"{n_unw} of {numel} elements never written (still hold the NaN poison), "
                   f"first at flat index {first_unw}")
    elif n_nf:
        failure = f"{n_nf} of {numel} elements are NaN/Inf, first at flat index {first_nf}"
    elif mis is not None:
        i, got, want = mis
        failure = (f"{n_mis} of {numel} elements beyond atol={atol:g} + rtol={rtol:g}*|ref|, first at flat index {i} "
                   f"(got {got:.6g}, want {want:.6g}); max |err| {max_abs:.3g}")
    return Check(numel, n_unw, n_nf, n_mis, max_abs, rel_l2, tol_ratio, failure)


def _first(mask: Any) -> int:
    return int(mask.nonzero()[0, 0])


def disagreement(out: Any, ref: Any, atol: float, rtol: float) -> str | None:
    """The quick check (serve warm-up, demo): None when ``out`` is within atol + rtol*|ref| wherever the
    reference is finite and finite there, else what is wrong in one line. ``check_output`` is the full one."""
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return f"output shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    o, r = out.double(), ref.double()
    finite = torch.isfinite(r)
    if not bool(torch.isfinite(o)[finite].all()):
        return "non-finite output where the reference is finite"
    err = (o - r).abs()
    bad = (err > atol + rtol * r.abs()) & finite
    n = int(bad.sum())
    if n:
        return (f"{n} of {bad.numel()} elements differ from the reference "
                f"(max |err| {float(err[finite].max()):.3g}, atol {atol}, rtol {rtol})")
    return None
