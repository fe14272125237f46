"""The live release of a server, and how a new one replaces it (hot swap).

A source is a release directory (reload re-reads it: point a symlink elsewhere, or rebuild
in place) or a registry directory (reload follows its pointer, ``serve.source.resolve``: the loader expects
the evidence pinned on activation, and trusted activator keys refuse a forged or older pointer). ``prepare``
loads, checks and warms a release off to the side; only then does ``ReleaseHolder`` swap
it in, with one attribute assignment. A request takes ``holder.current`` once when it
starts and finishes on that release, so in-flight requests complete on the old one while
new requests go to the new one. A release that fails to load or warm never replaces the
one serving; the failure is kept (``last_failure``) for readiness, the repository index,
logs and metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tileship.errors import BundleIntegrityError, TileshipError
from tileship.runtime.dispatch import Release
from tileship.serve.source import (  # noqa: F401 (re-exported)
    MANIFEST_READ_LIMIT,
    Target,
    release_id_at,
    resolve,
    rollback_target,
)
from tileship.serve.warmup import WarmReport, warm_up

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from tileship.release.pointer_seal import Sealed

#: releases swapped out whose snapshots are kept (requests still in flight on them finish there)
RETIRED_KEEP = 2


@dataclass
class Served:
    """A release that is loaded, checked and warmed: what requests run on."""

    release: Release
    target: Target
    devices: dict[str, str]   # operator -> torch device its requests run on
    device_label: str
    warm: WarmReport
    load_seconds: float
    loaded_at: float = field(default_factory=time.time)
    diagnostics_id: str | None = None
    #: whole models bound to this release (``serve.model``): name -> BoundModel
    models: dict[str, Any] = field(default_factory=dict)

    @property
    def release_id(self) -> str:
        return self.release.release_id


def image_check(release: Release) -> dict[str, Any]:
    """The image this server runs in (``TILESHIP_IMAGE_DIGEST``) against the one the release is pinned
    to (``release.images.pinned``: the registry's ``publish --image-digest`` record, else the lock's):
    {"running", "pinned", "mismatch"}; a mismatch only when both are known and differ."""
    from tileship import env
    from tileship.release import images

    running, pinned = env.image_digest(), images.pinned(release.path, release.lock)
    return {"running": running, "pinned": pinned, "mismatch": bool(running and pinned and running != pinned)}


def serving_devices(release: Release) -> tuple[dict[str, str], str]:
    """Per operator: "cuda" when a GPU is present and the operator has CUDA specializations,
    else "cpu"; plus a label for the info metric."""
    import torch

    cuda = torch.cuda.is_available()
    devices = {name: "cuda" if cuda and any(e.spec is not None and e.spec.target != "c" for e in r.entries) else "cpu"
               for name, r in release.ops.items()}
    if cuda:
        p = torch.cuda.get_device_properties(0)
        return devices, f"cuda:{p.name} (sm_{p.major}{p.minor})"
    return devices, "cpu"


#: (release path, reference_only, evidence pin or None) -> the loaded release
Loader = Callable[[Path, bool, "str | None"], Release]
#: ``ServeConfig.loader``, a test hook: (release path, reference_only) -> the loaded release
LoadHook = Callable[[Path, bool], Release]


def unpinned(hook: LoadHook | None) -> Loader | None:
    """A two-argument loader (``ServeConfig.loader``, a test hook) as a ``Loader``: it is not given the pin."""
    return (lambda path, reference_only, _pin: hook(path, reference_only)) if hook is not None else None


class ReleaseHolder:
    """The served release plus the state readiness reports. Swaps are one assignment.

    ``prepare`` and ``swap`` are called by the app (prepare on a worker thread, swap on the
    event loop, one reload at a time); readers just read ``current``.
    """

    def __init__(self, source: Path, loader: Loader, *, force_reference: bool = False, warmup_limit: int = 256,
                 warmup_threads: int = 1, activator_keys: Iterable[Path | Ed25519PublicKey] | None = (),
                 generation_state: Path | None = None,
                 after_load: Callable[[Release], str | None] | None = None,
                 bind_models: Callable[[Release, dict[str, str]], dict[str, Any]] | None = None,
                 registry_id: str | None = None) -> None:
        from tileship.release import pointer_seal, pointer_served

        self.source = Path(source)
        self._load = loader
        self.force_reference = force_reference
        self.warmup_limit = warmup_limit
        self.warmup_threads = warmup_threads
        self.after_load = after_load
        self.bind_models = bind_models
        self.current: Served | None = None
        self.state = "loading"          # loading | ready | failed | fatal
        self.last_failure: dict[str, Any] | None = None
        self.fatal: str | None = None
        #: releases swapped out, newest last, their snapshots kept for requests still running on them
        self.retired: list[Served] = []
        #: the state a registry rollback would return to, loaded and warmed ahead (``App.prewarm_rollback``)
        self.standby: Served | None = None
        #: trusted activator keys (None: ``TILESHIP_TRUSTED_ACTIVATOR_KEYS``) and the pointer serving under them
        self.activator_keys = pointer_seal.trusted(activator_keys)
        #: the registry id its pointers must be bound to (``--trusted-registry-id``; None: the env var, else any)
        self.registry_id = registry_id
        #: where the pointer served is kept across restarts (``--generation-state``; None: not kept)
        self.generation_state = generation_state
        self.pointer: Sealed | None = pointer_served.read_served(generation_state)
        self._kept = self.pointer
        #: (release id, evidence pin) the release directory source is a registry's copy of (``follow``)
        self.told: tuple[str, str | None, bool] | None = None

    def follow(self, path: Path, release_id: str | None, evidence: str | None, reference_only: bool = False) -> None:
        """Serve ``path`` as a registry's copy of ``release_id`` with ``evidence`` pinned (a Ray fleet replica): loads
        expect both, as when following the registry itself; ``reference_only`` as the registry's pointer activated
        it (``activate --reference``; or the server's own ``--reference-only``). ``release_id`` None: a plain
        release directory."""
        self.source = Path(path)
        self.told = (release_id, evidence, reference_only) if release_id is not None else None

    def resolve(self) -> Target:
        """What the source names now; under activator keys, a pointer no older than ``pointer``."""
        target = resolve(self.source, force_reference=self.force_reference, activator_keys=self.activator_keys,
                         after=self.pointer, registry_id=self.registry_id)
        if self.told is not None and target.path == self.source:
            target = replace(target, release_id=self.told[0], evidence=self.told[1],
                             reference_only=self.told[2] or self.force_reference)
        return target

    def unchanged(self, target: Target, rid: str | None) -> bool:
        """Whether ``target`` (release ``rid`` on disk) is what serves; then its pointer is the one serving."""
        cur = self.current
        if cur is None or (rid, target) != (cur.release_id, cur.target):
            return False
        self._serving(target.sealed)
        return True

    def _serving(self, sealed: Sealed | None) -> None:
        """The pointer ``sealed`` (checked; None: not checked) names what serves: replays older than it are refused
        from now on and, with ``generation_state``, after a restart too. A failure to keep it is a ``last_failure``
        (stage ``generation_state``): the release serves, and a restart refuses only what is older than the state
        kept before."""
        self.pointer = sealed or self.pointer
        if self.generation_state is None or self.pointer is None or self.pointer == self._kept:
            return
        from tileship.release import pointer_served

        try:
            pointer_served.write_served(self.generation_state, self.pointer)
            self._kept = self.pointer
        except OSError as exc:
            self.last_failure = {"stage": "generation_state", "error": f"{self.generation_state}: cannot be "
                                 f"written ({exc.strerror or exc})", "at": round(time.time(), 3)}

    def prepare(self, target: Target) -> Served:
        """Load ``target`` (integrity, lock, no-JIT dlopen) and warm it, off to the side. A release whose id is not
        the one the registry names it by (``Target.release_id``) is refused (BundleIntegrityError), never served.

        Raises what the loader raises (TileshipError for a bad bundle, strict drift, a
        reference that does not import), and what ``bind_models`` raises (the whole models
        are swapped onto the release here, before it can take traffic). Warm-up failures are
        values (``Served.warm``).
        """
        t0 = time.perf_counter()
        release = self._load(target.path, target.reference_only, target.evidence)
        if target.release_id is not None and release.release_id != target.release_id:
            raise BundleIntegrityError(
                f"{target.path}: holds release {release.release_id}, not {target.release_id} as the registry names "
                f"it (the copy was replaced or renamed); not served", path=str(target.path),
                hint=f"publish release {target.release_id} again (tileship publish --replace) or activate another")
        load_s = time.perf_counter() - t0
        diag = self.after_load(release) if self.after_load else None
        devices, label = serving_devices(release)
        warm = warm_up(release, devices, limit=self.warmup_limit, threads=self.warmup_threads)
        models = self.bind_models(release, devices) if self.bind_models else {}
        return Served(release, target, devices, label, warm, load_s, diagnostics_id=diag, models=models)

    def rollback_target(self) -> Target | None:
        """What ``tileship rollback`` would make this server's source serve: the newest state in a
        registry's history. None for a release directory or an empty history. Raises RegistryError."""
        return rollback_target(self.source, force_reference=self.force_reference,
                               activator_keys=self.activator_keys, registry_id=self.registry_id)

    def warm(self, target: Target) -> Served | None:
        """A release already loaded and warmed in this process that is exactly ``target`` (the same
        directory, mode, evidence pin and release id on disk): the standby, or one swapped out and still kept."""
        rid = release_id_at(target.path)
        for served in ([self.standby] if self.standby else []) + self.retired[::-1]:
            if (served.target == target and served.release_id == rid and self.fatal is None):
                return served
        return None

    def take(self, served: Served) -> Served:
        """Remove ``served`` (from ``warm``) from the standby slot or the retired list, to swap it in."""
        if self.standby is served:
            self.standby = None
        elif served in self.retired:
            self.retired.remove(served)
        return served

    def keep_standby(self, served: Served) -> None:
        """Hold ``served`` as the warm rollback standby; the standby it replaces is retired."""
        old, self.standby = self.standby, served
        if old is not None and old is not served:
            self.retire(old)

    def swap(self, served: Served, sealed: Sealed | None = None) -> Served | None:
        """Make ``served`` current (named by the pointer ``sealed``, if checked); return the one it replaces. The
        last ``RETIRED_KEEP`` replaced releases keep their snapshots (requests still running on them finish there);
        older ones are closed, so a server reloaded many times keeps a bounded number of snapshot copies."""
        old, self.current = self.current, served
        self.last_failure = None
        self._serving(sealed)
        if self.fatal is None:
            self.state = "ready"
        if old is not None and old is not served:
            self.retire(old)
        return old

    def retire(self, served: Served) -> None:
        """A release nothing new is routed to (swapped out, or a dropped canary): kept among the last
        ``RETIRED_KEEP``, then its snapshot is removed."""
        self.retired.append(served)
        while len(self.retired) > RETIRED_KEEP:
            self.retired.pop(0).release.close()

    def fail(self, target: str, stage: str, error: BaseException | str) -> dict[str, Any]:
        """Record a failed load/warm-up; the current release (if any) keeps serving."""
        if isinstance(error, TileshipError):
            msg, hint = error.message, error.hint
        elif isinstance(error, BaseException):
            msg, hint = f"{type(error).__name__}: {error}", None
        else:
            msg, hint = error, None
        self.last_failure = {"source": target, "release_id": release_id_at(Path(target)), "stage": stage, "error": msg,
                             "hint": hint, "at": round(time.time(), 3)}
        if self.current is None and self.fatal is None:
            self.state = "failed"
        return self.last_failure

    def poison(self, reason: str) -> None:
        """A sticky device error: this process must not answer again (readiness false for good)."""
        self.fatal = reason
        self.state = "fatal"

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """(ready, body) for /v2/health/ready."""
        body: dict[str, Any] = {"live": True, "state": self.state, "source": str(self.source)}
        cur = self.current
        if cur is not None:
            rel = cur.release
            body.update(release=rel.release_id, kernel_revision=rel.kernel_revision, device=cur.device_label,
                        reference_only=cur.target.reference_only, notes=list(rel.notes))
            if cur.warm.failures:
                body["warmup_failures"] = dict(cur.warm.failures)
        if self.standby is not None:  # what a registry rollback swaps in without loading (serve.standby)
            body["standby"] = {"release": self.standby.release_id,
                               "reference_only": self.standby.target.reference_only}
        if self.last_failure is not None:
            body["last_failure"] = dict(self.last_failure)
        if self.fatal is not None:
            body.update(ready=False,
                        reason=f"the device context is poisoned ({self.fatal}); this process exits so its supervisor "
                               "restarts it")
            return False, body
        if cur is None:
            if self.state == "failed" and self.last_failure:
                body.update(ready=False,
                            reason=f"no release is serving: loading {self.last_failure['source']} failed at "
                                   f"{self.last_failure['stage']}: {self.last_failure['error']}")
            else:
                body.update(ready=False, reason=f"loading and warming the release from {self.source}")
            return False, body
        rel = cur.release
        if cur.target.reference_only:
            reason = "ready: reference-only by policy: every operator serves the PyTorch reference"
        elif rel.drift.blocking:
            reason = (f"ready: blocking drift ({rel.drift.reason}); the drift policy allows reference serving, "
                      "so every operator serves the PyTorch reference")
        else:
            kernels = sum(1 for r in rel.ops.values() for e in r.entries if e.kernel is not None)
            reason = f"ready: {kernels} kernel specializations loaded and warmed"
        body.update(ready=True, reason=reason)
        return True, body

    def index(self) -> list[dict[str, Any]]:
        """The repository index: one row per (model, version) with state and reason."""
        rows: list[dict[str, Any]] = []
        cur = self.current
        fail = self.last_failure
        if cur is not None:
            ready, body = self.readiness()
            for name, runner in sorted(cur.release.ops.items()):
                decisions = sorted({f"{e.decision.path}:{e.decision.reason}" for e in runner.entries})
                reason = body["reason"] if not ready else f"serving ({', '.join(decisions) or 'reference'})"
                if fail is not None:
                    reason += f"; last reload from {fail['source']} failed at {fail['stage']}: {fail['error']}"
                rows.append({"name": name, "version": cur.release_id, "state": "READY" if ready else "UNAVAILABLE",
                             "reason": reason})
            for name, bound in sorted(cur.models.items()):
                rows.append({"name": name, "version": cur.release_id, "state": "READY" if ready else "UNAVAILABLE",
                             "reason": f"serving ({bound.summary()})" if ready else body["reason"]})
        if fail is not None and fail.get("release_id") and (cur is None or fail["release_id"] != cur.release_id):
            rows.append({"name": "*", "version": fail["release_id"], "state": "UNAVAILABLE",
                         "reason": f"failed at {fail['stage']}: {fail['error']}"})
        if cur is None and fail is None:
            rows.append({"name": "*", "version": "", "state": "LOADING" if self.fatal is None else "UNAVAILABLE",
                         "reason": self.readiness()[1]["reason"]})
        return rows

