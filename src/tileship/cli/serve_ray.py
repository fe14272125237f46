"""``tileship serve --ray``: the flags of ``serve`` that shape a Ray Serve fleet, checked, then
``serve.ray_fleet.run_fleet`` (Ray is imported only there)."""

from __future__ import annotations

from tileship.errors import DeclarationError
from tileship.serve.config import ServeConfig


def serve_fleet(config: ServeConfig, *, host: str, port: int, address: str | None, replicas: int, min_replicas: int,
                max_replicas: int | None, canary_requests: int, canary_seconds: float) -> int:
    """Run the fleet in the foreground; its exit status. Raises DeclarationError for flags a fleet cannot honour."""
    from tileship.serve.canary import CanaryPolicy
    from tileship.serve.fleet_plan import FleetPolicy
    from tileship.serve.ray_fleet import FleetOptions, run_fleet

    refused = [flag for flag, on in (("--workers", config.workers), ("--grpc-port", config.grpc_port is not None),
                                     ("--llama", config.llama is not None)) if on]
    if refused:
        raise DeclarationError(f"{', '.join(refused)} cannot be combined with --ray yet",
                               hint="a fleet serves KServe v2 REST from one process per replica")
    policy = FleetPolicy(CanaryPolicy(window_requests=canary_requests, window_seconds=canary_seconds).check())
    options = FleetOptions(address=address, replicas=replicas, min_replicas=min_replicas, max_replicas=max_replicas,
                           policy=policy)
    options.deployment_options(config.max_inflight, 0)  # DeclarationError for bad bounds before Ray starts
    return run_fleet(config, options, host=host, port=port)
