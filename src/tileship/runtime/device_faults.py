"""The device-fault classifier: which errors poison a CUDA context for good (a sticky error).

After one of these every later CUDA call in the process fails, so the only recovery is a new
process (``tileship serve`` exits with ``EXIT_FATAL`` for its supervisor to restart it). The one
list used by the server and by ``benchmarks/gpu_fault_recovery.py``.
"""

from __future__ import annotations

#: messages of CUDA errors that poison the context for good (every later CUDA call fails)
STICKY_CUDA_ERRORS = (
    "illegal memory access", "illegal address", "an illegal instruction", "illegal instruction",
    "unspecified launch failure", "device-side assert", "misaligned address",
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "cudaErrorIllegalAddress", "cudaErrorLaunchFailure",
)


def is_sticky_text(text: str) -> bool:
    """True when an error message (or a traceback) names a sticky CUDA error."""
    return any(s in text for s in STICKY_CUDA_ERRORS)


def is_sticky_cuda_error(exc: BaseException) -> bool:
    """True when ``exc`` is a sticky CUDA error: the process must restart to use the GPU again."""
    return is_sticky_text(f"{type(exc).__name__}: {exc}")
