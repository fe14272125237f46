"""The device-fault classifier: which errors poison a CUDA context for good (a sticky error).

After one of these every later CUDA call in the process fails, so the only recovery is a new
process (``tileship serve`` exits with ``EXIT_FATAL`` for its supervisor to restart it). The one
list used by the server and by ``benchmarks/gpu_fault_recovery.py``.
"""

from __future__ import annotations

from collections.abc import Callable

#: messages of CUDA errors that poison the context for good (every later CUDA call fails)
STICKY_CUDA_ERRORS = (
    "illegal memory access", "illegal address", "an illegal instruction", "illegal instruction",
    "operation not supported on global/shared address space",  # what the H200 fault drill produced
    "unspecified launch failure", "device-side assert", "misaligned address",
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "cudaErrorIllegalAddress", "cudaErrorLaunchFailure",
)


def is_sticky_text(text: str) -> bool:
    """True when an error message (or a traceback) names a sticky CUDA error."""
    return any(s in text for s in STICKY_CUDA_ERRORS)


def is_sticky_cuda_error(exc: BaseException) -> bool:
    """True when ``exc`` is a sticky CUDA error: the process must restart to use the GPU again."""
    return is_sticky_text(f"{type(exc).__name__}: {exc}")


def probe_device(device: str) -> str | None:
    """Whether ``device`` (``"cuda"``, ``"cuda:1"``) still runs work after an exception on a CUDA
    path: synchronize, run a tiny op, synchronize again. None when it does; else the error text
    (the context is poisoned: a sticky fault). Never raises; a CPU device is never probed."""
    if not device.startswith("cuda"):
        return None
    try:
        import torch

        torch.cuda.synchronize(device)
        x = torch.ones(8, device=device)
        if float((x + x).sum().item()) != 16.0:
            return f"the probe on {device} computed a wrong result"
        torch.cuda.synchronize(device)
    except Exception as exc:  # torch.AcceleratorError (torch >= 2.8) and RuntimeError alike
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def is_sticky_fault(exc: BaseException, device: str, probe: Callable[[str], str | None] = probe_device) -> bool:
    """True when ``exc``, raised on a call on ``device``, left the device unusable: a known sticky
    message, or (for any other error on a CUDA device) a failing ``probe``. A message list alone
    misses errors it does not name; the probe asks the device itself."""
    if is_sticky_cuda_error(exc):
        return True
    return device.startswith("cuda") and probe(device) is not None
