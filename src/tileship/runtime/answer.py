"""What a reference answered, held to the declaration: one torch tensor per declared output, each of the dtype
and shape the declaration gives it for the call.

The kernel path allocates its outputs as declared; an operator's reference may answer anything (a NumPy array,
float64 where float32 is declared, a row short, a tuple of the wrong length). Served as it came, such an answer
reaches the caller (``release.op(name)(...)``, ``.call``, the torch custom ops, whose compiled graphs assume the
declared outputs) or a response unlike the model's metadata. Both the dispatcher (``runtime.dispatch``, per memo
key) and the server (``serve.answer``, per plan) check it here, with the same words:

    outputs_of      the answer as a tuple of tensors; DeclarationError when it is not ``n_outputs`` tensors
    check_outputs   each output's dtype (an identity test), shape and device against what is declared for the call
    check_device    each output's device alone (a worker process, which checks before copying its answer out)
    checker         for one memo key: what is declared, worked out once, as a callable ``check(res) -> res``
    declared_at     what is declared at a call's dims, for the callers that call a reference directly (verify, tune,
                    demo): they hold its answer with ``checker`` too

An output's device is the one the call's tensor inputs are on (the kernel allocates its outputs there; a
reference that answers on the CPU, or on ``meta``, would hand the caller a tensor the rest of the model cannot
use). Every error is a ``DeclarationError`` with ``field="reference"`` naming the operator and the output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tileship.errors import DeclarationError

if TYPE_CHECKING:
    from tileship.runtime.decision import OpShape

#: per declared output: (name, torch dtype or None where the call leaves it open, shape for the call or None
#: where a dim cannot be told, declared dims)
Declared = tuple[tuple[str, Any, tuple[int, ...] | None, Sequence[Any]], ...]


def outputs_of(name: str, out: Any, n_outputs: int, *, strict: bool = False) -> tuple[Any, ...]:
    """The outputs of operator ``name``'s call result ``out`` (None: no outputs, an operator that only
    updates inputs in place; a tuple or list: several; else one). Raises DeclarationError (field
    ``reference``) when they are not ``n_outputs`` torch tensors; ``strict``: also when one output comes in a
    sequence of one (a call returns it bare, as the kernel path does)."""
    import torch

    seq = isinstance(out, (tuple, list))
    outs = () if out is None else tuple(out) if seq else (out,)
    if len(outs) != n_outputs or not all(isinstance(o, torch.Tensor) for o in outs) or (strict and seq
                                                                                         and n_outputs == 1):
        got = ", ".join(type(o).__name__ for o in outs) or "nothing"
        if seq:
            got = f"a {type(out).__name__} of {len(out)}" + (f" ({got})" if out else "")
        only_updates = " (it only updates inputs in place: its reference returns None)" if not n_outputs else ""
        raise DeclarationError(f"the call answered {got}; the operator declares {n_outputs} output tensor(s)"
                               f"{only_updates}",
                               operator=name, field="reference",
                               hint=f"make the reference return {_want(n_outputs)}, as the kernel does")
    return outs


def _want(n_outputs: int) -> str:
    return "None" if not n_outputs else "one torch tensor" if n_outputs == 1 else f"a tuple of {n_outputs} tensors"


def check_outputs(name: str, outs: Sequence[Any], declared: Declared, device: Any = None) -> None:
    """Raises DeclarationError (field ``reference``) when an output of operator ``name``'s call (``outs``, from
    ``outputs_of``) is not of the dtype and shape ``declared`` for the call (a dtype or shape of None is not
    checked), or not on ``device`` (the call's inputs' torch device; None: not checked)."""
    for (out_name, want, shape, ds), o in zip(declared, outs, strict=True):
        if (want is not None and o.dtype is not want) or (shape is not None and o.shape != shape):
            got = str(o.dtype).removeprefix("torch.")
            kind = str(want or o.dtype).removeprefix("torch.")  # None: the call's inputs leave the dtype open
            raise DeclarationError(
                f"output {out_name!r} of the call is {got} {list(o.shape)}; the operator declares it "
                f"{kind} {list(shape) if shape is not None else list(ds)} for this call",
                operator=name, field="reference",
                hint="make the reference return its outputs in the declared dtypes and shapes, as the kernel does")
        if device is not None and o.device != device:
            _off_device(name, repr(out_name), o, device)


def check_device(name: str, outs: Sequence[Any], device: Any, names: Sequence[str] | None = None) -> None:
    """Raises DeclarationError (field ``reference``) when an output of operator ``name``'s call (``outs``, from
    ``outputs_of``) is not on ``device`` (the call's inputs' torch device; None: not checked), naming it by its
    declared name (``names``; None: by its position)."""
    if device is None:
        return
    for i, o in enumerate(outs):
        if o.device != device:
            _off_device(name, repr(names[i]) if names else str(i), o, device)


def _off_device(name: str, what: str, o: Any, device: Any) -> None:
    raise DeclarationError(f"output {what} of the call is on {o.device}; the call's inputs are on {device}",
                           operator=name, field="reference",
                           hint="make the reference return its outputs on its inputs' device, as the kernel does")


def declared_at(outputs: Sequence[tuple[str, Sequence[Any]]], specs: Sequence[tuple[Any, Any]], *,
                dtypes: bool = True) -> Declared:
    """What is declared for a call: each output (name, declared dims) with its (shape at the call's dims or None,
    torch dtype) from ``specs``; ``dtypes`` False leaves the dtypes open (a reference run on inputs cast to
    float64 answers in float64)."""
    return tuple((n, dt if dtypes else None, tuple(shape) if shape is not None else None, ds)
                 for (n, ds), (shape, dt) in zip(outputs, specs, strict=True))


def checker(name: str, n_outputs: int, declared: Declared | None, device: Any = None) -> Callable[[Any], Any]:
    """``check(res) -> res`` for one memo key of operator ``name``: raises as ``outputs_of`` and ``check_outputs``
    do (``declared`` None: the outputs' dtypes and shapes are not known, only their count, type and device are
    checked; ``device`` None: the device is not). Per output, the test is one exact type test, one dtype identity,
    one shape compare and one device compare."""
    import torch

    tensor = torch.Tensor

    def full(res: Any) -> Any:
        outs = outputs_of(name, res, n_outputs, strict=True)
        if declared is not None:
            check_outputs(name, outs, declared, device)
        else:
            check_device(name, outs, device)
        return res

    if not n_outputs or declared is None or device is None or any(shape is None for _, _, shape, _ in declared):
        return full
    if n_outputs == 1:
        ((_, dtype, shape, _),) = declared

        def one(res: Any) -> Any:
            if type(res) is not tensor or res.dtype is not dtype or res.shape != shape or res.device != device:
                return full(res)  # a tensor subclass (a Parameter, a FakeTensor) may still be as declared
            return res

        return one
    dtypes = tuple(dtype for _, dtype, _, _ in declared)
    shapes = tuple(shape for _, _, shape, _ in declared)
    if n_outputs == 2:  # unrolled: the loop below costs twice as much
        (d0, d1), (s0, s1) = dtypes, shapes

        def two(res: Any) -> Any:
            if type(res) is tuple and len(res) == 2:
                o0, o1 = res
                if type(o0) is tensor and type(o1) is tensor and o0.dtype is d0 and o1.dtype is d1 \
                        and o0.shape == s0 and o1.shape == s1 and o0.device == device and o1.device == device:
                    return res
            return full(res)

        return two

    def several(res: Any) -> Any:  # a tuple: ``ReferencePath._ref`` makes a list one
        if type(res) is tuple and len(res) == n_outputs:
            for o, dtype, shape in zip(res, dtypes, shapes):  # noqa: B905 (the lengths are equal)
                if type(o) is not tensor or o.dtype is not dtype or o.shape != shape or o.device != device:
                    break
            else:
                return res
        return full(res)

    return several


def key_checker(shape: OpShape, outs: Sequence[tuple[tuple[int, ...], Any]] | None, tensors: Sequence[Any],
                same: Sequence[bool], reason: str | None = None) -> Callable[[Any], Any]:
    """``checker`` for a memo key of the operator ``shape`` whose declared outputs have the (shape, torch dtype)
    ``outs`` at the key (``runtime.route.expected_outputs``; None where not known), on the device of the key's
    ``tensors`` (the dispatcher has checked that they share one). Where the key's inputs are of dtypes the operator
    does not declare (``reason`` ``undeclared_dtype``: an int64 tensor where int32 is declared, or the call's
    ``tensors`` of the operator dtype (``same``) disagreeing, float32 and float64), the reference serves on them and
    nothing declares the outputs' dtypes (torch promotes): only their shapes and device are held."""
    mixed = reason == "undeclared_dtype" or len({t.dtype for t, s in zip(tensors, same, strict=False) if s}) > 1
    known = outs is not None and len(shape.outputs) == len(outs) == shape.n_outputs
    declared = tuple((n, None if mixed else dt, tuple(size), ds)
                     for (n, ds), (size, dt) in zip(shape.outputs, outs or (), strict=False))
    device = tensors[0].device if tensors else None
    return checker(shape.name, shape.n_outputs, declared if known else None, device)


__all__ = ["Declared", "check_device", "check_outputs", "checker", "declared_at", "key_checker", "outputs_of"]
