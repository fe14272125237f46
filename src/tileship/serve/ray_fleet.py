"""``tileship serve --ray``: a Ray Serve fleet of KServe v2 servers with rolling activation.

Each replica (``serve.ray_replica``) is the ``tileship serve`` app itself
(``serve.routes.create_app`` over a ``Service``), wrapped with ``@serve.ingress``: the same
routes, protocol, validation, metrics and hot swap. A replica loads the release the fleet assigns
it straight from the registry (no JIT), and warms it before Ray Serve routes a request to it
(``__serve_build_asgi_app__`` awaits the load). It asks for one GPU when the cluster has one.

``FleetController`` (a named Ray actor) drives ``serve.fleet_plan.FleetPlan``: it polls the
registry's active release and rolls a change through the replicas, canary first. A change is of the release
id, or of the registry's copy of it (``publish --replace``) or its evidence pin (activated again): the plan
follows versions (``fleet_plan.version_of``: the id, the copy and the pin), so a new copy or pin of the same
release goes canary first like a new release does, never to every replica at once. A release activated
reference-only (``activate --reference``; every version with ``serve --ray --reference-only``) is a version of its
own, which every replica switches to at once (the tested default: no canary judges it). Replicas
``sync`` with it every ``poll_s``: they send the version they serve, load failures and a sample
per answered inference request (model, release, seconds, error); they get back the release to
serve, the copy and the pin of their assigned version, and hot-swap to it with ``Service.reload`` (loaded and
warmed off to the side; in-flight requests finish on the release they started on), so no request fails during a
roll. A rollback moves the registry's pointer back (``Registry.rollback``) and logs the reason; a refused copy or
pin of the release served leaves the pointer as it is (the registry cannot name the earlier one): the fleet
keeps serving the earlier one until the registry names another version.

With trusted activator keys (``--trusted-activator-key``, ``TILESHIP_TRUSTED_ACTIVATOR_KEYS``, given to the
controller as raw public keys) the controller checks the pointer as a server does on every poll
(``pointer_seal.active_checked``): a pointer that is unsigned, forged or older than the one it follows is not
rolled (``fleet_pointer_refused`` is logged once per refusal, the fleet keeps its release), and its own rollback moves
the pointer back only from the pointer it accepted. That rollback is sealed with ``TILESHIP_ACTIVATOR_KEY`` in
the controller's environment; without it the pointer it writes is unsigned, and refused (logged) like any other.
With ``--generation-state`` the controller keeps the pointer it followed across restarts (``pointer_seal``).

Ray is optional (the ``tileship[ray]`` extra): nothing here imports it before a fleet starts.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tileship.errors import DeclarationError, PointerSignatureError, RegistryError, TileshipError
from tileship.serve.config import ServeConfig
from tileship.serve.fleet_plan import FleetPlan, FleetPolicy, is_reference, release_of, version_of
from tileship.serve.ray_replica import CONTROLLER, NAMESPACE, FleetReplica

APP = "tileship"


@dataclass(frozen=True)
class FleetOptions:
    """The fleet's shape. ``max_replicas`` set: autoscale between ``min_replicas`` and it on
    ongoing requests per replica (``target_ongoing``); otherwise a fixed ``replicas``."""

    address: str | None = None
    replicas: int = 2
    min_replicas: int = 1
    max_replicas: int | None = None
    target_ongoing: float = 4.0
    upscale_delay_s: float = 10.0    # load above the target this long adds replicas
    downscale_delay_s: float = 60.0  # and below it this long removes them (never under min_replicas)
    replica_cpus: float = 1.0
    poll_s: float = 0.25
    policy: FleetPolicy = FleetPolicy()

    def deployment_options(self, max_ongoing: int, gpus: float) -> dict[str, Any]:
        """Ray Serve deployment options for these settings (``gpus``: per replica)."""
        opts: dict[str, Any] = {"ray_actor_options": {"num_cpus": self.replica_cpus, "num_gpus": gpus},
                                "max_ongoing_requests": max_ongoing, "health_check_period_s": 2.0}
        if self.max_replicas is not None:
            if not 1 <= self.min_replicas <= self.max_replicas:
                raise DeclarationError(f"autoscaling bounds: need 1 <= --min-replicas ({self.min_replicas}) "
                                       f"<= --max-replicas ({self.max_replicas})")
            opts["autoscaling_config"] = {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                                          "target_ongoing_requests": self.target_ongoing,
                                          "upscale_delay_s": self.upscale_delay_s,
                                          "downscale_delay_s": self.downscale_delay_s}
        elif self.replicas < 1:
            raise DeclarationError(f"--replicas must be >= 1, got {self.replicas}")
        else:
            opts["num_replicas"] = self.replicas
        return opts


def require_serve() -> tuple[Any, Any]:
    """(ray, ray.serve). Raises TileshipError naming the extra when Ray Serve is not installed."""
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise TileshipError(f"tileship serve --ray needs Ray Serve ({exc.name} is not installed)",
                         hint="pip install 'tileship[ray]' (on the driver and on every node)") from exc
    return ray, serve


def raw_keys(paths: Sequence[Path] | None) -> list[bytes]:
    """Trusted activator public keys (None: ``TILESHIP_TRUSTED_ACTIVATOR_KEYS``, read here, on the driver) as raw
    bytes for the controller actor. Raises SignatureError naming an unusable key file."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from tileship.release import pointer_seal

    return [k.public_bytes(Encoding.Raw, PublicFormat.Raw) for k in pointer_seal.trusted(paths)]


class FleetController:
    """The Ray actor owning the plan: replicas sync here; a loop follows the registry."""

    def __init__(self, registry_root: str, policy: FleetPolicy, poll_s: float, activator_keys: Sequence[bytes] = (),
                 generation_state: str | None = None, registry_id: str | None = None,
                 force_reference: bool = False) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        from tileship.release import pointer_served
        from tileship.release.registry import Registry
        from tileship.serve.jsonlog import JsonLog

        self.registry = Registry(registry_root)
        self.plan = FleetPlan(policy)
        self.poll_s = poll_s
        self.log = JsonLog(sys.stderr)
        self.logged = 0
        self.task: asyncio.Task[None] | None = None
        #: trusted activator keys (raw ed25519 public keys: a key file need not exist on the controller's node)
        self.keys = [Ed25519PublicKey.from_public_bytes(k) for k in activator_keys]
        self.state = Path(generation_state) if generation_state else None
        self.registry_id = registry_id  # the registry id pointers must be bound to (None: its env var, else any)
        self.pointer = pointer_served.read_served(self.state)  # the pointer followed (None: none yet, or no keys)
        self.followed: str | None = None                     # the release id of that pointer
        #: release id -> the evidence pin an accepted pointer recorded for it: what a replica loading it expects
        self.pins: dict[str, str | None] = {}
        #: release id -> whether the accepted pointer activated it reference-only (``activate --reference``)
        self.modes: dict[str, bool] = {}
        self.force_reference = force_reference  # ``serve --ray --reference-only``: every version reference-only
        #: version -> (release id, the registry's copy, evidence pin, reference-only): what a replica assigned that
        #: version loads
        self.versions: dict[str, tuple[str, str, str | None, bool]] = {}
        self.refused: PointerSignatureError | None = None     # why the last pointer read was refused (logged)

    async def start(self) -> str | None:
        """Start following the registry; returns the release the fleet starts on. Raises PointerSignatureError
        for a pointer the trusted activator keys refuse."""
        ok, rid = self._active()
        if not ok and self.refused is not None:
            raise self.refused
        self.plan.tick(self._version(rid), time.monotonic())
        if self.task is None:
            self.task = asyncio.create_task(self._loop())
        return release_of(self.plan.stable) if self.plan.stable else None

    async def sync(self, replica: str, report: dict[str, Any]) -> dict[str, Any]:
        """The replica's assignment: ``release`` id, ``path`` (the registry's copy), ``evidence`` (the pin) and
        ``reference_only`` of the version the plan assigns it (all None before anything was activated)."""
        version = self.plan.sync(replica, report, time.monotonic())
        if version is None:
            return {"release": None, "path": None, "evidence": None, "reference_only": None}
        rid = release_of(version)
        _, path, evidence, ref = self.versions.get(version) or (rid, "", self.pins.get(rid), is_reference(version))
        if not path or not Path(path).is_dir():  # that copy was replaced since (publish --replace): the current one
            path = str(self.registry.path_of(rid))
        return {"release": rid, "path": path, "evidence": evidence, "reference_only": ref}

    async def status(self) -> dict[str, Any]:
        """The plan's status and ``versions``: each version it names -> its release, copy and evidence pin."""
        st = self.plan.status(time.monotonic())
        st["versions"] = {v: {"release": rid, "copy": path, "evidence": ev, "reference_only": ref}
                          for v, (rid, path, ev, ref) in sorted(self.versions.items())}
        return st

    async def _loop(self) -> None:
        while True:
            try:
                await self._step()
            except Exception as exc:  # the fleet keeps serving; the next poll tries again
                self.log.event("fleet_error", "error", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self.poll_s)

    def _active(self) -> tuple[bool, str | None]:
        """(whether the pointer was accepted, the release to follow): under trusted activator keys, checked as a
        server does (``pointer_seal.active_checked``: sealed by one of them, not older than the pointer followed); a
        refused one is logged and the release followed before stays."""
        from tileship.release import pointer_seal, pointer_served

        try:
            active, sealed = pointer_seal.active_checked(self.registry.root, self.keys, self.pointer, self.registry_id)
        except PointerSignatureError as exc:
            last, self.refused = self.refused, exc
            if last is None or exc.message != last.message:
                self.log.event("fleet_pointer_refused", "error", error=exc.message, hint=exc.hint,
                               following=self.followed)
            return False, self.followed
        self.refused, self.followed = None, active.release_id
        if active.release_id is not None:
            self.pins[active.release_id] = active.evidence
            self.modes[active.release_id] = bool(active.reference_only)
        if sealed is not None and sealed != self.pointer:
            self.pointer = sealed
            if self.state is not None:
                pointer_served.write_served(self.state, sealed)
        return True, active.release_id

    def _version(self, rid: str | None) -> str | None:
        """The version of release ``rid`` the registry names now: its current copy, the pin and mode recorded for it."""
        if rid is None:
            return None
        path, evidence = str(self.registry.path_of(rid)), self.pins.get(rid)
        ref = self.force_reference or self.modes.get(rid, False)
        version = version_of(rid, path, evidence, ref)
        self.versions[version] = (rid, path, evidence, ref)
        return version

    def _forget(self, active: str | None) -> None:
        """Drop the versions nothing names any more (the active one, the plan's stable, roll, refused, replicas')."""
        p = self.plan
        named = {active, p.stable, p.refused, *(s.version for s in p.replicas.values())}
        if p.roll is not None:
            named |= {p.roll.target, p.roll.previous}
        self.versions = {k: v for k, v in self.versions.items() if k in named}

    async def _step(self) -> None:
        _, rid = await asyncio.to_thread(self._active)
        active = await asyncio.to_thread(self._version, rid)
        for action, release, reason in self.plan.tick(active, time.monotonic()):
            if action == "registry_rollback":
                await asyncio.to_thread(self._registry_rollback, release, reason)
        for ev in [e for e in self.plan.events if e["seq"] > self.logged]:
            self.log.event("fleet_" + ev["event"], "warning" if ev["event"] == "rolled_back" else "info",
                           **{k: v for k, v in ev.items() if k not in ("event", "seq")})
        self.logged = self.plan.seq
        self._forget(active)

    def _registry_rollback(self, release: str, reason: str) -> None:
        """Move the registry back from ``release`` (only while it is still the active one, named by a pointer
        the trusted activator keys accept)."""
        if self._active() != (True, release):
            return
        back = self.registry.rollback()
        self.log.event("fleet_registry_rollback", "warning", refused=release, active=back.release_id, reason=reason)


class Fleet:
    """A fleet on a Ray cluster: ``start`` deploys it and returns the HTTP URL; ``stop`` removes it.
    Raises TileshipError when Ray Serve is missing or the cluster cannot be reached,
    RegistryError when the source is not a registry with an active release."""

    def __init__(self, config: ServeConfig, options: FleetOptions = FleetOptions()) -> None:
        from tileship.release.registry import Registry

        root = Path(config.source)
        if (root / "manifest.json").is_file() or not root.is_dir():
            raise RegistryError(f"{root}: tileship serve --ray serves a registry directory (its active release)",
                             hint="tileship publish RELEASE && tileship activate ID, then serve the registry")
        if Registry(root).active().release_id is None:
            raise RegistryError(f"registry {root} has no active release", hint="run `tileship activate ID`")
        self.config, self.options = config, options
        self.opened = False
        self.url = ""

    def start(self, host: str = "127.0.0.1", port: int = 8000) -> str:
        ray, serve = require_serve()
        if not ray.is_initialized():
            from tileship.build.ray_farm import _check_reachable
            from tileship.errors import BuildError

            try:
                _check_reachable(self.options.address)
            except BuildError as exc:
                raise TileshipError(exc.message, hint=exc.hint) from exc
            ray.init(address=self.options.address or None, namespace=NAMESPACE, include_dashboard=False,
                     logging_level="warning")
            self.opened = True
        try:
            ray.get_actor(CONTROLLER, namespace=NAMESPACE)
        except ValueError:
            pass  # none: the usual case
        else:
            if self.opened:
                ray.shutdown()
            raise TileshipError(f"a tileship fleet already runs on this Ray cluster (actor {NAMESPACE}/{CONTROLLER})",
                                hint="stop that `tileship serve --ray` first (one fleet per cluster)")
        serve.start(http_options={"host": host, "port": port})
        from tileship.release import registry_id

        actor = ray.remote(num_cpus=0)(FleetController)
        state = self.config.generation_state
        self.controller = actor.options(name=CONTROLLER, namespace=NAMESPACE).remote(
            str(Path(self.config.source).resolve()), self.options.policy, self.options.poll_s,
            raw_keys(self.config.trusted_activator_keys), str(Path(state).resolve()) if state else None,
            registry_id.trusted(self.config.trusted_registry_id),  # the env var here: the actor's may lack it
            self.config.reference_only)
        ray.get(self.controller.start.remote())
        gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        deployment = serve.deployment(name=APP, **self.options.deployment_options(self.config.max_inflight, gpus))(
            serve.ingress()(FleetReplica))
        serve.run(deployment.bind(self.config, self.options.poll_s), name=APP, route_prefix="/")
        self.url = f"http://{host}:{port}"
        return self.url

    def status(self) -> dict[str, Any]:
        import ray

        return ray.get(self.controller.status.remote())  # type: ignore[no-any-return]

    def stop(self) -> None:
        ray, serve = require_serve()
        try:
            serve.delete(APP)
            ray.kill(self.controller)
            serve.shutdown()
        finally:
            if self.opened:
                ray.shutdown()


def run_fleet(config: ServeConfig, options: FleetOptions, *, host: str, port: int) -> int:
    """``tileship serve --ray`` in the foreground: deploy, print the fleet's events as JSON
    lines until SIGINT/SIGTERM, then remove the application. Returns the exit status (0)."""
    import signal
    import threading

    fleet = Fleet(config, options)
    url = fleet.start(host, port)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    st = fleet.status()
    print(json.dumps({"event": "fleet_ready", "url": url, "release": st["stable"], "replicas": len(st["replicas"])}),
          file=sys.stderr, flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        fleet.stop()
    return 0
