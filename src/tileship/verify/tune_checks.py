"""What tune checks of an operator before it measures any group of it (``prepare``): its reference and sample
hook import and its pins hold. A failure is text naming the step and the error, recorded as the failure of each
of the operator's groups (``tuning.failure``), never raised: the other operators are tuned. A sticky CUDA error is
raised (every later group would fail with it: not this operator's failure).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tileship.build import pins


def prepare(desc: dict[str, Any], op: str, lock: Mapping[str, Any], import_reference: Callable[..., Any],
             import_sample: Callable[..., Any]) -> tuple[Any, Any] | str:
    """(reference, sample hook) of operator ``op``, its pins checked against ``lock`` (timing another reference
    would not describe this release); else why not, naming the step and the error: the failure of each of its
    groups (``tuning.failure``), not of the run. A sticky CUDA error is raised (not the operator's failure)."""
    from tileship.runtime.device_faults import is_sticky_cuda_error

    step = "import_reference"
    try:
        reference = import_reference(desc, op)
        step = "pins.require"
        pins.require(lock, [op])
        step = "import_sample"
        return reference, import_sample(desc, op)
    except Exception as exc:  # noqa: BLE001 -- one operator's import or pins fail its groups, not every group
        if is_sticky_cuda_error(exc):
            raise
        return f"{step}: {first_line(exc)}"


def first_line(exc: Exception) -> str:
    """``Type: first line of the message`` of ``exc``."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


__all__ = ["first_line", "prepare"]
