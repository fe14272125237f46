"""What tune checks of an operator before it measures any group of it (``prepare``): its reference and sample
hook import and its pins hold. A failure is text naming the step and the error, recorded as the failure of each
of the operator's groups (``tuning.failure``), never raised: the other operators are tuned. A sticky CUDA error is
raised (every later group would fail with it: not this operator's failure). ``load_member`` loads one
specialization of a group the same way: what its load raised is that candidate's failure, never the run's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tileship.build import pins
from tileship.errors import ArtifactLoadError
from tileship.release.tuning import LOAD_FAILED

#: ``prepare``'s text for an operator whose pins do not hold (its reference changed since the build) starts so
DRIFTED = "pins.require:"


def prepare(desc: dict[str, Any], op: str, lock: Mapping[str, Any], import_reference: Callable[..., Any],
            import_sample: Callable[..., Any]) -> tuple[Any, Any] | str:
    """(reference, sample hook) of operator ``op``, its pins checked against ``lock`` (measuring against another
    reference would not describe this release); else why not, naming the step and the error (``DRIFTED`` when
    the pins do not hold: ``pins.require: ReferenceDrift: reference drift: operator ..., module ...``): the
    failure of each of its groups (``tuning.failure``) or, for ``verify``, of each of its specializations, never
    of the run (docs/verification.md, "A pinned reference"). A sticky CUDA error is raised (not the operator's
    failure)."""
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


def load_member(load: Callable[[Path, str], Any], spec_dir: Path, spec_id: str) -> Any:
    """``load(spec_dir, spec_id)`` (``runtime.loader.load_artifact``): the loaded kernel, or the text
    ``artifact failed to load: ...`` naming the error, which ``tune_group`` records as that candidate's failure at
    every point of its group (it cannot win; the others are verified and timed). Not only ArtifactLoadError: an
    OSError, a tvm-ffi RuntimeError or a ValueError of a corrupt file that escaped the loader is the candidate's
    failure too, not the run's. A sticky CUDA error is raised (every later group would fail with it)."""
    from tileship.runtime.device_faults import is_sticky_cuda_error

    try:
        return load(spec_dir, spec_id)
    except ArtifactLoadError as exc:
        return f"{LOAD_FAILED}: {exc}"
    except Exception as exc:  # noqa: BLE001 -- one artifact that does not load fails its candidate, not the run
        if is_sticky_cuda_error(exc):
            raise
        return f"{LOAD_FAILED}: {spec_id}: {first_line(exc)}"


def first_line(exc: Exception) -> str:
    """``Type: first line of the message`` of ``exc``."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


def inputs_failed(exc: Exception) -> str:
    """What a warm-up or demo row says when an operator's ``sample`` hook raised: ``making inputs failed: ...``.
    A sticky CUDA error is raised instead (the device is gone for every later call: not this operator's failure)."""
    from tileship.runtime.device_faults import is_sticky_cuda_error

    if is_sticky_cuda_error(exc):
        raise exc
    return f"making inputs failed: {first_line(exc)}"


def blames_reference(failure: str | None, op: str) -> bool:
    """Whether a candidate's verification ``failure`` at a point (``spec_check.verify_spec``) is not the candidate's:
    operator ``op``'s reference raised (``reference raised ...``) or broke its declaration (``OP.reference: ...``:
    ``runtime.answer``'s words), or its sample hook failed (``making inputs failed: ...``). Tune fails the group
    then: the reference cannot be the tested default there."""
    return bool(failure) and str(failure).startswith(("reference raised ", "making inputs failed: ",
                                                      f"{op}.reference:"))


def reference_raised(exc: Exception, when: str = "") -> str:
    """What a tune group's failure says when its reference raised (``when``: where, e.g. while timed): ``the
    reference raised Type: message...``. A sticky CUDA error is raised instead (not this operator's failure)."""
    from tileship.runtime.device_faults import is_sticky_cuda_error

    if is_sticky_cuda_error(exc):
        raise exc
    return f"the reference raised {first_line(exc)}{when}"


__all__ = ["DRIFTED", "LOAD_FAILED", "blames_reference", "first_line", "inputs_failed", "load_member", "prepare",
           "reference_raised"]
