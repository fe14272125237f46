from __future__ import annotations

from pathlib import Path

import typer

from tileship.cli._common import handle_errors


@handle_errors
def serve(
    source: Path = typer.Argument(...,
                                  help="a release directory, or a registry directory (its active release is served)"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8000, min=0, max=65535, help="port to listen on (0: a free one)"),
    grpc_port: int | None = typer.Option(None, help="also serve KServe v2 gRPC (tritonclient.grpc) on this port, "
                                                     "same process and models (Triton's default is 8001; 0: a free "
                                                     "port); off when not given. A gRPC message is at most 2 "
                                                     "GiB - 1 whatever --max-body-mib and --max-output-mib say "
                                                     "(logged at start when they pass it)"),
    max_body_mib: float = typer.Option(64.0, help="largest request body accepted (413 above); gRPC requests stay "
                                                  "capped at 2 GiB - 1 past 2048"),
    max_output_mib: float = typer.Option(1024.0, help="largest total output of one call (413 above, before running); "
                                                      "a gRPC answer stays capped at 2 GiB - 1 past 2048, except "
                                                      "outputs written to shared memory"),
    max_inflight: int = typer.Option(64,
                                     help="inference calls admitted at once (queued or running, after the body is "
                                          "read); 503 above"),
    max_connections: int = typer.Option(1024, help="open connections; requests past it get 503"),
    header_timeout: float = typer.Option(10.0, help="seconds a client may take to send request headers (then closed)"),
    keep_alive: int = typer.Option(5, help="seconds an idle keep-alive connection stays open"),
    threads: int = typer.Option(1, help="worker threads running operator calls (1: kernel calls are serialized)"),
    workers: int = typer.Option(0, help="run the calls in this many worker processes, plus one warm standby that "
                                        "takes over when a worker dies, wedges or faults (0: in this process)"),
    gpus: str | None = typer.Option(None, help="with --workers: spread the worker processes over these GPUs, e.g. "
                                               "0,1 (each worker sees only its own, through CUDA_VISIBLE_DEVICES)"),
    worker_timeout: float | None = typer.Option(None, help="seconds a worker may take to answer a call before it is "
                                                           "killed and replaced (default: --timeout)"),
    timeout: float = typer.Option(30.0, help="seconds an admitted request may take to run (504 after)"),
    inline_us: float = typer.Option(500.0, help="in process, run a small call on the event loop, not a request "
                                                "thread, once a kernel has served it within this many us "
                                                "(0: always a thread; such a call is never answered 504)"),
    worker_spin_us: float | None = typer.Option(None, help="with --workers: a worker polls this many us for its next "
                                                            "call after each answer before it sleeps (0: it sleeps at "
                                                            "once; default 300, or 0 with fewer than 4 usable CPUs)"),
    loop_spin_us: float | None = typer.Option(None, help="with --workers: the event loop polls this many us for a "
                                                          "small call's answer before it waits on the socket (0: it "
                                                          "waits at once; default 100, or 0 with fewer than 4 usable "
                                                          "CPUs)"),
    body_timeout: float = typer.Option(30.0, help="seconds a client may take to send the request body (408 after), "
                                                  "or a unary gRPC RPC its request message (DEADLINE_EXCEEDED after; "
                                                  "not a stream's)"),
    body_threads: int = typer.Option(0, help="threads reading request bodies of 4 MiB and more straight from the "
                                             "socket, off the event loop (0: all on the event loop; see "
                                             "docs/serving.md before turning it on)"),
    strict_shapes: bool = typer.Option(False,
                                       help="answer 400 for shapes outside the declared set instead of serving them by "
                                            "reference"),
    drift_policy: str | None = typer.Option(None,
                                            help="fallback (serve the reference on blocking drift) or strict (refuse: "
                                                 "not ready); default: the release's"),
    allow_unverified: bool | None = typer.Option(None, "--allow-unverified/--no-allow-unverified",
                                                    help="run GPU kernels that have no verification evidence"),
    reference_only: bool = typer.Option(False,
                                        help="serve every operator through its PyTorch reference (load no native "
                                             "code)"),
    warmup_threads: int = typer.Option(1, help="specializations warmed at once before a release takes traffic"),
    warm_rollback: bool = typer.Option(True,
                                       help="with a registry: keep the release `tileship rollback` returns to "
                                            "loaded and warm, so a rollback swaps without loading"),
    check_finite: bool = typer.Option(True,
                                      help="recompute kernel outputs holding NaN/Inf on the reference and open the "
                                           "circuit"),
    trusted_key: list[Path] = typer.Option([],
                                           help="ed25519 public key(s); when given, the release must be signed by one"),
    trusted_activator_key: list[Path] = typer.Option([], help="ed25519 public key(s) of the activator role; when "
                                                     "given (default: $TILESHIP_TRUSTED_ACTIVATOR_KEYS), a registry's "
                                                     "active.json must be sealed by one and never older than the "
                                                     "pointer serving"),
    trusted_registry_id: str | None = typer.Option(None, help="with trusted activator keys: the registry id (32 hex, "
                                                   "`tileship releases` shows it) every pointer must be bound to, the "
                                                   "first one too (default: $TILESHIP_TRUSTED_REGISTRY_ID; none: the "
                                                   "first pointer's registry is trusted)"),
    generation_state: Path | None = typer.Option(None, help="with trusted activator keys: keep the pointer served "
                                                 "(its generation) in this file, so that a restarted server refuses "
                                                 "an older one (default: $TILESHIP_POINTER_STATE; none: not kept)"),
    diagnostics_dir: Path | None = typer.Option(None,
                                                help="where diagnostics bundles go (default "
                                                     "$TILESHIP_HOME/diagnostics)"),
    diagnostics_interval: float = typer.Option(60.0, help="at most one serve-time bundle per reason per this many s"),
    diagnostics_keep: int = typer.Option(50, help="bundles kept in the diagnostics directory (oldest deleted)"),
    log_level: str = typer.Option("warning", help="uvicorn's own log level (tileship's events are always logged)"),
    llama: str | None = typer.Option(None,
                                     help="also serve a random-weight Llama decoder swapped onto the release, as model "
                                          "`llama`: "
                                               "a preset (tiny, 7b-2layer) or a JSON file (docs/serving.md); needs the "
                                               "repository's "
                                               "examples/llama (not installed by pip)"),
    ray: bool = typer.Option(False, "--ray", help="serve SOURCE (a registry) from a Ray Serve fleet with rolling "
                                                  "activation (docs/ray.md); needs `pip install 'tileship[ray]'`"),
    ray_address: str | None = typer.Option(None, "--ray-address",
                                           help="the Ray cluster, e.g. HOST:6379 (implies --ray)"),
    replicas: int = typer.Option(2, help="--ray: replicas (one GPU each where the cluster has GPUs)"),
    min_replicas: int = typer.Option(1, help="--ray with --max-replicas: the autoscaling floor"),
    max_replicas: int | None = typer.Option(None, help="--ray: autoscale on ongoing requests up to this many replicas"),
    canary_requests: int = typer.Option(50, help="--ray: canary-replica requests judged before the rest roll"),
    canary_seconds: float = typer.Option(5.0, help="--ray: and at least this many seconds of canary traffic"),
) -> None:
    """Serve a release over the Open Inference Protocol (KServe v2 REST, and gRPC with --grpc-port; tritonclient works).

    Each operator is a model, its version the release id. Ready once the release is loaded
    and warmed. SIGHUP or POST /v2/repository/reload swaps in what SOURCE points at now.
    Exit 0 on SIGINT/SIGTERM; 3 after a sticky device error (restart the process); 1 if it
    could not listen, or when trusted activator keys refuse the registry's pointer.
    """
    from tileship import env
    from tileship.errors import DeclarationError, TileshipError
    from tileship.release import pointer_seal

    try:
        from tileship.serve import ServeConfig, gpu_map, run
        from tileship.serve.validate import RequestLimits
    except ModuleNotFoundError as exc:  # the serve extra is not installed
        raise TileshipError(f"tileship serve needs {exc.name}, which is not installed",
                            hint="pip install 'tileship[serve]'") from exc

    if grpc_port is not None and not 0 <= grpc_port <= 65535:
        raise DeclarationError(f"--grpc-port must be a port number (0..65535), got {grpc_port}")
    if grpc_port is not None and grpc_port == port and port != 0:
        raise DeclarationError(f"--grpc-port {grpc_port} is also --port; give gRPC a port of its own")
    if drift_policy not in (None, "fallback", "strict"):
        raise DeclarationError(f"--drift-policy must be fallback or strict, got {drift_policy!r}")
    if min(max_body_mib, max_output_mib, timeout, body_timeout, header_timeout) <= 0 or \
            min(max_inflight, threads, max_connections, keep_alive, warmup_threads) < 1:
        raise DeclarationError("--max-body-mib, --max-output-mib, --timeout, --body-timeout and --header-timeout must "
                               "be > 0; --max-inflight, --threads, --max-connections, --keep-alive and "
                               "--warmup-threads >= 1")
    if workers < 0 or (worker_timeout is not None and worker_timeout <= 0) or \
            not all(us is None or 0 <= us <= 1e6 for us in (inline_us, worker_spin_us, loop_spin_us)) or \
            not 0 <= body_threads <= 256:
        raise DeclarationError("--workers must be >= 0, --worker-timeout > 0, --body-threads 0 to 256, and "
                               "--inline-us, --worker-spin-us and --loop-spin-us 0 to 1000000")
    gpu_list = gpu_map.parse(gpus)
    if gpu_list and not workers:
        raise DeclarationError("--gpus spreads worker processes over GPUs: give --workers N too",
                               hint="e.g. --workers 2 --gpus 0,1")
    if workers and llama is not None:
        raise DeclarationError("--llama is not served with --workers yet", hint="drop --workers (or --llama)")
    generation_state = generation_state or env.pointer_state()
    keyed = bool(pointer_seal.trusted(tuple(trusted_activator_key) or None))
    if generation_state is not None and not keyed:
        raise DeclarationError(f"--generation-state {generation_state} keeps the pointer a server checked: give "
                               "--trusted-activator-key (or $TILESHIP_TRUSTED_ACTIVATOR_KEYS) too")
    trusted_registry_id = _registry_id(trusted_registry_id, keyed)
    spec = None
    if llama is not None:
        from tileship.extras import llama_example

        spec = llama_example().parse_spec(llama)
    config = ServeConfig(source=source, max_body_bytes=int(max_body_mib * (1 << 20)), max_inflight=max_inflight,
                         worker_threads=threads, workers=workers, gpus=gpu_list, worker_timeout_s=worker_timeout,
                         request_timeout_s=timeout, body_timeout_s=body_timeout, body_threads=body_threads,
                         strict_shapes=strict_shapes,
                         inline_us=inline_us, worker_spin_us=worker_spin_us, loop_spin_us=loop_spin_us,
                         drift_policy=drift_policy,
                         allow_unverified=allow_unverified, trusted_keys=tuple(trusted_key) or None,
                         trusted_activator_keys=tuple(trusted_activator_key) or None,
                         generation_state=generation_state, trusted_registry_id=trusted_registry_id,
                         reference_only=reference_only, warm_rollback=warm_rollback, warmup_threads=warmup_threads,
                         check_finite=check_finite, diagnostics_dir=diagnostics_dir, llama=spec,
                         limits=RequestLimits(max_output_bytes=int(max_output_mib * (1 << 20))),
                         max_connections=max_connections, header_timeout_s=header_timeout, keep_alive_s=keep_alive,
                         diagnostics_interval_s=diagnostics_interval, diagnostics_keep=diagnostics_keep,
                         grpc_port=grpc_port)
    _check_pointer(source, config.trusted_activator_keys, generation_state, trusted_registry_id)
    if ray or ray_address:
        from tileship.cli.serve_ray import serve_fleet

        raise typer.Exit(serve_fleet(config, host=host, port=port, address=ray_address, replicas=replicas,
                                     min_replicas=min_replicas, max_replicas=max_replicas,
                                     canary_requests=canary_requests, canary_seconds=canary_seconds))
    raise typer.Exit(run(config, host=host, port=port, log_level=log_level))


def _registry_id(given: str | None, keyed: bool) -> str | None:
    """``--trusted-registry-id`` (else its variable), checked: 32 hex digits, and only with trusted activator keys
    (only a sealed pointer's id means anything). Raises DeclarationError."""
    from tileship.errors import DeclarationError, RegistryError
    from tileship.release import registry_id

    try:
        value = registry_id.trusted(given)
    except RegistryError as exc:
        raise DeclarationError(exc.message, hint=exc.hint) from None
    if value is not None and not keyed:
        raise DeclarationError(f"--trusted-registry-id {value} binds the pointers a server checks: give "
                               "--trusted-activator-key (or $TILESHIP_TRUSTED_ACTIVATOR_KEYS) too")
    return value


def _check_pointer(source: Path, keys: tuple[Path, ...] | None, state: Path | None,
                   registry_id: str | None = None) -> None:
    """Refuse to start (exit 1, naming the file, the key id and what is wrong) on a registry pointer that trusted
    activator keys refuse, not bound to ``registry_id`` (``--trusted-registry-id``), or older than the one kept in
    ``state`` (``--generation-state``); a reload refuses the same pointer with 409 and keeps serving."""
    from tileship.errors import RegistryError
    from tileship.release import pointer_seal, pointer_served
    from tileship.serve.source import resolve

    if trusted := pointer_seal.trusted(keys):
        try:
            resolve(source, activator_keys=trusted, after=pointer_served.read_served(state), registry_id=registry_id)
        except RegistryError:
            pass  # nothing active, no such directory: the server starts and says so, as without activator keys


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
