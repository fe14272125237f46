"""tileship: ship TileLang kernels to production with a pinned toolchain, ahead-of-time
builds, a verified PyTorch fallback and releases you can roll back.

Data flow: spec -> lock -> build -> bundle -> (verify) -> registry -> runtime -> serve.
Heavy imports (torch, tilelang) happen lazily, inside the functions that need them.
"""

from __future__ import annotations

from typing import Any

from tileship.declare.candidates import Space
from tileship.declare.spec import DynamicRange, Operator, ScalarArg, Specialization, TensorArg, Tolerance
from tileship.errors import (
    ArtifactLoadError,
    BuildError,
    BundleError,
    BundleIntegrityError,
    CallError,
    CompileForbidden,
    DeclarationError,
    LockError,
    LockMismatch,
    ReferenceDrift,
    RegistryError,
    SignatureError,
    TileshipError,
    VerificationError,
)
from tileship.runtime.dispatch import Decision, OpRunner, Release

__version__ = "0.1.0"


def load(path: Any, **kwargs: Any) -> Release:
    """Load a release without compiling; see ``tileship.runtime.loader.load``."""
    from tileship.runtime.loader import load as _load

    return _load(path, **kwargs)


__all__ = [
    "ArtifactLoadError",
    "BuildError",
    "BundleError",
    "BundleIntegrityError",
    "CallError",
    "CompileForbidden",
    "Decision",
    "DeclarationError",
    "DynamicRange",
    "LockError",
    "LockMismatch",
    "OpRunner",
    "Operator",
    "ReferenceDrift",
    "RegistryError",
    "Release",
    "ScalarArg",
    "SignatureError",
    "Space",
    "Specialization",
    "TensorArg",
    "TileshipError",
    "Tolerance",
    "VerificationError",
    "__version__",
    "load",
]
