"""ScalarArgs on the call path: their part of the memo key, and the values a kernel cannot take as declared.

A ScalarArg (a Python number passed by value) adds its Python type to a call's memo key, never its value
(``scalar_key``): a key resolves once (``check_scalars`` judges the type then), and each call of it checks
only that an int is within what its declared dtype holds (``scalar_range``; a scalar of dtype "same" takes the
call's operator dtype: the dtype of its first tensor of dtype "same", ``key_ranges``). A value the kernel cannot take
is the caller's error, a CallError naming the argument: never a kernel fault that opens the circuit for
every later caller, nor a value the kernel is handed wrapped.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

from tileship.declare.dims import SAME
from tileship.errors import CallError
from tileship.runtime.route import key_any

_FLOAT_MAX = int(sys.float_info.max)


def _same_tensor(dtypes: Sequence[str], scalars: Sequence[int], n: int) -> int | None:
    """The position of the first tensor input of the operator dtype ("same"), or None when none is."""
    return next((i for i in range(n) if i not in scalars and (dtypes[i] if i < len(dtypes) else SAME) == SAME), None)


def key_ranges(dtypes: Sequence[str], scalars: Sequence[int],
               n: int) -> tuple[tuple[tuple[int, int, int], ...], tuple[int, tuple[int, ...]] | None]:
    """``scalar_key``'s ``ranged`` and ``same`` for an operator whose inputs are declared ``dtypes`` (empty: all
    "same"): a literal dtype's range for each scalar of one; and (the position of the first tensor of the operator
    dtype, the "same" scalars), whose range is that tensor's dtype's in each call. With no such tensor a "same"
    scalar gets a float's range (the call's dtype is not known from its arguments)."""
    at = _same_tensor(dtypes, scalars, n)
    same = tuple(i for i in scalars if (dtypes[i] if i < len(dtypes) else SAME) == SAME) if at is not None else ()
    ranged = tuple((i, *b) for i in scalars if i not in same
                   and (b := scalar_range(dtypes[i] if i < len(dtypes) else SAME)) is not None)
    return ranged, ((at, same) if at is not None and same else None)


@functools.cache
def _dtype_range(dtype: Any) -> tuple[int, int] | None:
    return scalar_range(str(dtype).removeprefix("torch."))


def scalar_key(tensors: Callable[[tuple[Any, ...]], tuple[Any, ...]], scalars: Sequence[int],
               n: int, ranged: Sequence[tuple[int, int, int]] = (),
               same: tuple[int, tuple[int, ...]] | None = None) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """The memo key of an operator with ScalarArgs: its ``tensors``' keys, then each scalar's Python type (never
    its value). It raises TypeError for a call with another number of arguments than ``n``: picking positions
    would ignore an extra argument, and the memoized kernel would be launched with it (and trip the breaker).
    It raises ValueError for a Python int outside the range of its declared dtype (``ranged``: each such scalar's
    (position, lowest, highest), ``scalar_range``): the value is not in the key, so this is the one check every
    call of a memoized key gets. Unchecked, the kernel would be handed an integer wrapped (``ctypes.c_int32(2**32
    + 5)`` is 5: a wrong answer) and a float's conversion would raise OverflowError (the breaker would open).
    ``same`` (``key_ranges``): the scalars of dtype "same", checked against the range of the dtype of the tensor
    at its first position (an int32 operator's "same" scalar is an int32)."""

    def key_of(args: tuple[Any, ...]) -> tuple[Any, ...]:
        if len(args) != n:
            raise TypeError(f"{len(args)} arguments, not {n}")  # the slow path names the operator and its inputs
        for i, lo, hi in ranged:
            v = args[i]
            if type(v) is int and not lo <= v <= hi:  # another type: the key holds it, ``check_scalars`` judges it
                raise ValueError(f"argument {i} is out of range")  # ``check_scalars`` names it
        if same is not None:
            for i in same[1]:
                v = args[i]
                if type(v) is int and (b := _dtype_range(args[same[0]].dtype)) is not None and not b[0] <= v <= b[1]:
                    raise ValueError(f"argument {i} is out of range")
        return (*key_any(tensors(args)), *(type(args[i]) for i in scalars))

    return key_of


def scalar_range(dtype: str) -> tuple[int, int] | None:
    """The lowest and highest Python int a ScalarArg of ``dtype`` takes: an integer dtype's range ("int32",
    "uint8"), a float's for the floating ones and "same" (a larger int cannot be converted to a C float or double);
    None for "bool" (a bool is checked by type)."""
    for prefix, signed in (("uint", False), ("int", True)):
        if dtype.startswith(prefix) and dtype[len(prefix):].isdigit():
            bits = int(dtype[len(prefix):])
            return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return None if dtype == "bool" else (-_FLOAT_MAX, _FLOAT_MAX)


def check_scalars(args: tuple[Any, ...], scalars: Sequence[int], inputs: Sequence[tuple[str, Any]], op: str,
                  dtypes: Sequence[str] = ()) -> None:
    """Raises CallError naming a ScalarArg that is not a Python number, or (``dtypes``: the declared
    dtype of each input) a number the kernel cannot take as declared: a non-integer for an integer
    scalar, an int outside the dtype's range (``scalar_range``), a non-bool for a bool one. Checked when a key is first
    seen (the Python type is in the key; ``scalar_key`` checks the range of every call), so such a call is
    the caller's error, never a kernel fault that trips the breaker nor a value the kernel gets wrapped."""
    for i in scalars:
        v = args[i]
        if not isinstance(v, (int, float, bool)):
            raise CallError(f"is a ScalarArg: pass a Python number, got {type(v).__name__}", operator=op,
                            argument=inputs[i][0], hint="pass float(x) / int(x), or x.item() for a one-element tensor")
        want = dtypes[i] if i < len(dtypes) else ""
        same = want in ("", SAME)
        if same and (at := _same_tensor(dtypes, scalars, len(args))) is not None:
            want = str(getattr(args[at], "dtype", "")).removeprefix("torch.") or want  # the call's operator dtype
        if want == "bool" and not isinstance(v, bool):
            raise CallError(f"is a bool ScalarArg, got {type(v).__name__}", operator=op, argument=inputs[i][0],
                            hint="pass True or False")
        if want.startswith(("int", "uint")) and (isinstance(v, bool) or not isinstance(v, int)):
            raise CallError(f"is an {want} ScalarArg, got {type(v).__name__} {v!r:.40}", operator=op,
                            argument=inputs[i][0], hint="pass a Python int (int(x) when the value is whole)")
        bounds = scalar_range(want or SAME)
        if bounds is not None and type(v) is int and not bounds[0] <= v <= bounds[1]:
            floating = bounds[1] == _FLOAT_MAX
            lo, hi = (f"{b:.4g}" if floating else str(b) for b in bounds)
            got = repr(v) if v.bit_length() <= 64 else f"an int of {v.bit_length()} bits"  # str() refuses 4300 digits
            what = ("a ScalarArg of the operator dtype" + (f" ({want})" if want not in ("", SAME) else "") if same
                    else f"{'an' if want.startswith('int') else 'a'} {want} ScalarArg")
            raise CallError(f"is {what}, got {got}, outside the range it takes [{lo}, {hi}]", operator=op,
                            argument=inputs[i][0], hint="pass a value in the declared dtype's range")


__all__ = ["check_scalars", "key_ranges", "scalar_key", "scalar_range"]
