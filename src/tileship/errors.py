"""Every error tileship raises on purpose.

    TileshipError                      base; carries ``hint`` (how to fix it)
    ├── DeclarationError               an operator declaration or project file is wrong (names the field)
    ├── LockError                      a lock file is missing, unreadable or malformed
    │   └── LockMismatch               strict policy: blocking drift between lock and environment
    │       └── ReferenceDrift         a pinned reference module differs from the release's (names operator, module)
    ├── BuildError                     the build as a whole could not run
    │   └── ToolchainError             the hermetic toolchain cannot be locked, created or used
    ├── BundleError                    a release bundle is malformed
    │   ├── BundleIntegrityError       a file's hash, a missing/extra file, an edited manifest (names the file)
    │   └── SignatureError             the signature is missing, malformed or does not verify
    │       └── PointerSignatureError  a registry's active.json is unsigned, tampered, sealed by an untrusted
    │           │                      activator key, or older than the pointer served (names file, key id)
    │           └── PointerExpiredError  its sealed ``expires`` has passed (names the file and the instant)
    ├── ArtifactLoadError              a compiled artifact could not be loaded into this process
    ├── CompileForbidden               something tried to compile while a release was serving
    ├── CallError                      a call no path can serve (wrong arity, rank, mixed devices; names the argument)
    ├── KernelMismatch                 a model checkpoint names other kernels (release id, kernel revision)
    │                                  than the model runs
    ├── UnsupportedTileLang            the installed TileLang is outside the supported range (names both)
    ├── VerificationError              verification could not run (not: a kernel that failed it)
    ├── RegistryError                  registry operations (unknown release, refused activation)
    └── WorkerError                    a serving worker process (``serve --workers``) failed to start or to answer

Expected outcomes are values, not exceptions: a dispatch decision, a drift report, a build
result, a verification verdict. Exceptions from TileLang/TVM are translated in one place
(``translate``) so callers only ever see this tree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TypeVar

V = TypeVar("V")


class TileshipError(Exception):
    """Base of every tileship error. ``hint`` says how to fix it."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class DeclarationError(TileshipError):
    """An operator declaration or the project file is invalid; ``field`` names what."""

    def __init__(self, message: str, *, operator: str | None = None, field: str | None = None,
                 hint: str | None = None) -> None:
        where = ".".join(p for p in (operator, field) if p)
        super().__init__(f"{where}: {message}" if where else message, hint=hint)
        self.operator = operator
        self.field = field


class LockError(TileshipError):
    """A lock file is missing, unreadable or malformed."""


class LockMismatch(LockError):
    """Blocking drift under the strict policy. ``report`` is the DriftReport."""

    def __init__(self, message: str, *, report: object, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.report = report


class ReferenceDrift(LockMismatch):
    """The reference (the fallback) an operator imports is not the code the release pinned:
    blocking under every drift policy, since serving the reference is no longer the tested answer.
    ``operator`` and ``module`` name the first difference; ``report`` holds them all."""

    def __init__(self, message: str, *, operator: str, module: str, report: object, hint: str | None = None) -> None:
        super().__init__(message, report=report, hint=hint)
        self.operator = operator
        self.module = module


class BuildError(TileshipError):
    """The build could not run at all, or (``spec_id`` set, inside a compile worker) one specialization
    could not be traced: the worker reports it as that specialization's failure, a value."""

    def __init__(self, message: str, *, spec_id: str | None = None, hint: str | None = None) -> None:
        super().__init__(f"{spec_id}: {message}" if spec_id else message, hint=hint)
        self.spec_id = spec_id


class ToolchainError(BuildError):
    """The hermetic toolchain cannot be locked, created or used (``tileship toolchain``)."""


class BundleError(TileshipError):
    """A release bundle is malformed."""

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path


class BundleIntegrityError(BundleError):
    """A file does not match the manifest, is missing, or is not listed. ``path`` names it."""


class SignatureError(BundleError):
    """The manifest signature is missing, malformed, or made by an untrusted key."""


class PointerSignatureError(SignatureError):
    """A registry pointer (``active.json``) a server that trusts activator keys refuses: unsigned,
    malformed, sealed by a key it does not trust, changed after it was sealed, bound to another registry
    (``release.registry_id``), or a generation older than the pointer it serves (``release.pointer_seal``).
    ``path`` names the file; ``key_id`` the key the pointer says sealed it (None: unsigned)."""

    def __init__(self, message: str, *, path: str, key_id: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, path=path, hint=hint)
        self.key_id = key_id


class PointerExpiredError(PointerSignatureError):
    """A sealed pointer whose ``expires`` (``release.pointer_expiry``) has passed: refused as a frozen or replayed
    one, wherever the seal is checked. ``expires`` is the instant it stated (ISO 8601, UTC)."""

    def __init__(self, message: str, *, path: str, expires: str, key_id: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, path=path, key_id=key_id, hint=hint)
        self.expires = expires


class ArtifactLoadError(TileshipError):
    """A compiled specialization could not be loaded. ``spec_id`` names it."""

    def __init__(self, message: str, *, spec_id: str, hint: str | None = None) -> None:
        super().__init__(f"{spec_id}: {message}", hint=hint)
        self.spec_id = spec_id


class CompileForbidden(TileshipError):
    """A TileLang compile was attempted while no-JIT was in force; ``where`` names the entry point."""

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.where = where


class CallError(TileshipError):
    """Arguments that no path can serve. ``operator`` and ``argument`` name what was wrong."""

    def __init__(self, message: str, *, operator: str, argument: str | None = None, hint: str | None = None) -> None:
        where = f"{operator}({argument})" if argument else operator
        super().__init__(f"{where}: {message}", hint=hint)
        self.operator = operator
        self.argument = argument


def lookup(table: Mapping[str, V], name: str, what: str, where: str) -> V:
    """``table[name]``, or a CallError for operator ``name`` saying ``what`` and what ``where`` has instead
    (``lookup(ops, "gemm", "unknown operator", "this release")``: "gemm: unknown operator (this release
    has: add, rmsnorm)")."""
    try:
        return table[name]
    except KeyError:
        raise CallError(f"{what} ({where} has: {', '.join(sorted(table))})", operator=name) from None


class KernelMismatch(TileshipError):
    """A checkpoint's kernel stamp differs from the model's. ``expected``: the model's stamp
    (None: it runs no tileship kernels); ``found``: the checkpoint's."""

    def __init__(self, message: str, *, expected: object, found: object, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.expected = expected
        self.found = found


class UnsupportedTileLang(TileshipError):
    """The installed TileLang (``installed``; None: not installed) is outside the range tileship
    supports (``supported``, a specifier such as ``>=0.1.15,<0.1.16``)."""

    def __init__(self, message: str, *, installed: str | None, supported: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.installed = installed
        self.supported = supported


class VerificationError(TileshipError):
    """Verification could not run (no device, release unreadable)."""


class RegistryError(TileshipError):
    """A registry operation was refused (unknown release, failed checks, torn state)."""


class WorkerError(TileshipError):
    """A worker process of ``tileship serve --workers N`` could not load its release, or answered
    a call with an error that is a bug (an operator's reference raised); names the worker's pid."""


def translate(exc: BaseException, *, spec_id: str) -> TileshipError:
    """Map a TileLang/TVM/CUDA exception to the tileship error a caller should see."""
    if isinstance(exc, TileshipError):
        return exc
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if "no kernel image" in text or "CUDA_ERROR" in text or "cudaError" in text:
        hint = "the artifact was built for another GPU arch or the driver is too old; run `tileship check`"
    elif isinstance(exc, OSError):
        hint = "the shared library could not be opened; its native dependencies may be missing"
    else:
        hint = "run `tileship diagnose` to collect the sources, logs and environment"
    return ArtifactLoadError(first, spec_id=spec_id, hint=hint)


#: the summary of a compile that TileLang's compiler step refused (``build_summary``)
COMPILER_FAILED = "the compiler failed"
#: a compiler's diagnostic line (g++: ``x.cpp:57:22: error: ...``; nvcc: ``x.cu(57): error: ...``)
_DIAGNOSTIC = re.compile(r"\b(?:fatal )?error\b\s*:")


def build_summary(exc: BaseException) -> str:
    """One line for a specialization that failed to build (the build table, ``build-log.json``'s ``error``).
    TileLang's compiler failures open with the generated source (nvcc: ``<the .cu>\\nCompilation error: ...``)
    or the command line (the host compiler: ``Compilation Failed! [...]``): their summary is
    ``COMPILER_FAILED`` and the first diagnostic, when the text holds one (``build.compile_one`` looks for it in
    the compiler's output otherwise). The full text stays in the log."""
    text = f"{type(exc).__name__}: {exc}"
    if "Compilation error" in text or "Compilation Failed" in text:
        hit = first_diagnostic(text.split("Compilation error:", 1)[-1])  # after nvcc's copy of the source
        return f"{type(exc).__name__}: {COMPILER_FAILED}" + (f": {hit}" if hit else "")
    return text.splitlines()[0][:2000] if text.strip() else type(exc).__name__


def first_diagnostic(text: str) -> str | None:
    """The first compiler diagnostic of ``text`` from its ``error:`` on (the temporary file's path dropped; at
    most 1000 characters), None when there is none."""
    return next((line[m.start():].strip()[:1000] for line in text.splitlines() if (m := _DIAGNOSTIC.search(line))),
                None)
