"""The Triton extensions of the KServe v2 REST protocol that inference platforms call:
statistics, model configuration, and repository unload/load (issue 15, item 5).

    GET  /v2/models/stats, /v2/models/{m}[/versions/{v}]/stats   Triton's statistics extension
    GET  /v2/models/{m}[/versions/{v}]/config                     Triton's model-configuration extension
    POST /v2/repository/models/{m}/unload                         the model refuses inference until loaded
    POST /v2/repository/models/{m}/load                           reload the source, then serve {m} again

Statistics come from ``ModelStats``, which ``Service.infer`` feeds on the event loop (one
thread: plain dict updates, no locks). Per (model, version): ``success``/``fail`` are request
counts and total time (receive to response); ``compute_input`` is the body read, parse and
checks; ``queue`` the wait between admission and the worker starting the call, plus the
hand-back to the loop; ``compute_infer`` the call on the worker (tensors, kernel or reference,
device sync, copy back, encoding); ``compute_output`` building the response afterwards. Without
batching every successful request is one inference and one execution.

Unload is a set of names on the Service (``Service.unloaded``): it survives hot swaps, and
only ``load`` (or a restart) clears it. An unloaded model has no version available, as in Triton
(whose core answers NOT_FOUND "has no available versions", and UNAVAILABLE "is not at ready state"
for a request naming the version): inference, metadata and config answer 404 / NOT_FOUND, or 503 /
UNAVAILABLE when the request names the version, with a message saying how to load it again
(``ModelUnloaded``, over REST and gRPC alike); it is not ready (``/ready`` 503, gRPC ``ready:
false``) and is ``UNAVAILABLE`` in the repository index. Its statistics answer as its metadata, and the
statistics of all models leave it out (Triton lists only ready versions there).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tileship.release import strict_json
from tileship.serve import protocol, validate
from tileship.serve.body import control_body
from tileship.serve.validate import BadRequest, short

if TYPE_CHECKING:
    from tileship.serve.app import Service
    from tileship.serve.holder import Served

#: the Triton statistics buckets tileship measures (cache_hit/cache_miss: no response cache)
_BUCKETS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")

#: the extensions ``GET /v2`` claims: only those that work
EXTENSIONS = ["binary_tensor_data", "model_repository", "model_repository(unload_dependents)", "statistics",
              "model_configuration", "logging", "trace", "system_shared_memory"]


def claimed(service: Any) -> list[str]:
    """``EXTENSIONS``, plus ``cuda_shared_memory`` where this server can open CUDA IPC handles
    (a GPU visible to torch, and no worker processes: ``serve.shm.Regions.cuda_off``)."""
    if service.shm.cuda_off is not None:
        return EXTENSIONS
    import torch

    return [*EXTENSIONS, "cuda_shared_memory"] if torch.cuda.is_available() else EXTENSIONS


class _Row:
    __slots__ = ("counts", "ns", "last_ms", "inferences")

    def __init__(self) -> None:
        self.counts = dict.fromkeys(_BUCKETS, 0)
        self.ns = dict.fromkeys(_BUCKETS, 0)
        self.last_ms = 0
        self.inferences = 0


class ModelStats:
    """Per (model, version) counters and summed durations. Call only on the event loop."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], _Row] = {}

    def record(self, model: str, version: str, ok: bool, total_s: float, input_s: float = 0.0, queue_s: float = 0.0,
               infer_s: float = 0.0, output_s: float = 0.0) -> None:
        """One answered request. A failure counts only under ``fail``, as in Triton."""
        row = self._rows.get((model, version))
        if row is None:
            row = self._rows[(model, version)] = _Row()
        row.last_ms = int(time.time() * 1000)
        key = "success" if ok else "fail"
        row.counts[key] += 1
        row.ns[key] += int(total_s * 1e9)
        if not ok:
            return
        row.inferences += 1
        for k, s in (("compute_input", input_s), ("queue", queue_s), ("compute_infer", infer_s),
                     ("compute_output", output_s)):
            row.counts[k] += 1
            row.ns[k] += int(max(s, 0.0) * 1e9)

    def stat(self, model: str, version: str) -> dict[str, Any]:
        """Triton's ``$model_stat`` (zeros for a model not yet called)."""
        row = self._rows.get((model, version)) or _Row()
        return {"name": model, "version": version, "last_inference": row.last_ms, "inference_count": row.inferences,
                "execution_count": row.inferences,
                "inference_stats": {k: {"count": row.counts[k], "ns": row.ns[k]} for k in _BUCKETS}
                | {"cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0}},
                "response_stats": {}, "batch_stats": [], "memory_usage": []}


def served(service: Service) -> Served:
    """The release serving now; HTTPException 503 while none is."""
    cur = service.holder.current
    if cur is None:
        raise HTTPException(503, f"not ready: {service.holder.readiness()[1]['reason']}")
    return cur


def _names(cur: Served) -> list[str]:
    return sorted([*cur.release.ops, *cur.models])


def known(cur: Served, name: str) -> None:
    """HTTPException 404 naming what is served when ``cur`` does not serve ``name``."""
    if name not in cur.release.ops and name not in cur.models:
        raise HTTPException(404, f"unknown model {short(name)}: this release serves {', '.join(_names(cur))}")


def _versions(service: Service, cur: Served, name: str, version: str | None) -> list[str]:
    """The versions of ``name`` that are loaded: the active release, and a canary's while one runs."""
    loaded = [cur.release_id]
    can = getattr(service.canary, "canary", None)
    if can is not None and can.release_id != cur.release_id and (name in can.release.ops or name in can.models):
        loaded.append(can.release_id)
    if version is None:
        return loaded
    if version not in loaded:
        raise HTTPException(404, f"unknown version {short(version)} of model {name}: "
                                 f"loaded versions {', '.join(loaded)}")
    return [version]


def stat_rows(service: Service, name: str | None, version: str | None, protocol: str = "rest") -> list[dict[str, Any]]:
    """Triton's ``model_stats``: every loaded (model, version) for ``name`` None (an unloaded model left out, as
    Triton lists only ready versions), else those of ``name``. Raises HTTPException: 503 not ready, 404 unknown
    model or version, and as ``check_loaded`` for an unloaded ``name``."""
    cur = served(service)
    if name is None:
        return [service.stats.stat(n, v) for n in _names(cur) if n not in service.unloaded
                for v in _versions(service, cur, n, None)]
    known(cur, name)
    versions = _versions(service, cur, name, version)
    check_loaded(service, name, version, protocol)
    return [service.stats.stat(name, v) for v in versions]


async def stats(request: Request) -> Response:
    rows = stat_rows(request.app.state.service, request.path_params.get("name"), request.path_params.get("version"))
    return JSONResponse({"model_stats": rows})


def _triton_dtype(kserve: str) -> str:
    return "TYPE_STRING" if kserve == "BYTES" else f"TYPE_{kserve}"


def _tensors(meta: list[Mapping[str, Any]], *, inputs: bool) -> list[dict[str, Any]]:
    out = []
    for t in meta:
        row: dict[str, Any] = {"name": t["name"], "data_type": _triton_dtype(t["datatype"]), "dims": list(t["shape"])}
        if inputs:
            row |= {"format": "FORMAT_NONE", "is_shape_tensor": False, "allow_ragged_batch": False, "optional": False}
        else:
            row |= {"label_filename": "", "is_shape_tensor": False}
        out.append(row)
    return out


def model_metadata(service: Service, cur: Served, name: str) -> dict[str, Any]:
    """KServe v2 model metadata of ``name`` (served by ``cur``): tensors with -1 for the dims that vary."""
    if name in cur.models:
        return cur.models[name].metadata()  # type: ignore[no-any-return]
    decl = cur.release.declarations[name]
    return {"name": name, "versions": [cur.release_id], "platform": "tileship",
            "inputs": protocol.tensor_metadata(decl, "inputs"), "outputs": protocol.tensor_metadata(decl, "outputs"),
            "parameters": {"datatypes": [protocol.KSERVE[d] for d in decl["dtypes"]], "device": cur.devices[name],
                           "declared_shapes": validate.declared_shapes_text(decl),
                           "kernel_revision": cur.release.kernel_revision,
                           "strict_shapes": service.config.strict_shapes}}


def model_config(service: Service, cur: Served, name: str) -> dict[str, Any]:
    """Triton's model configuration for ``name``, from the release's declaration (or, for a
    whole model, its metadata). ``dims`` hold -1 where a dim varies across the declared
    shapes and ranges; ``data_type`` is the first declared dtype, ``parameters.datatypes`` all."""
    if name in cur.models:
        meta = cur.models[name].metadata()
        ins, outs, dtypes, shapes = meta["inputs"], meta["outputs"], [meta["outputs"][0]["datatype"]], ""
    else:
        decl = cur.release.declarations[name]
        ins, outs = protocol.tensor_metadata(decl, "inputs"), protocol.tensor_metadata(decl, "outputs")
        dtypes, shapes = [protocol.KSERVE[d] for d in decl["dtypes"]], validate.declared_shapes_text(decl)
    device = cur.models[name].device if name in cur.models else cur.devices.get(name, "cpu")
    params = {"release": cur.release_id, "kernel_revision": cur.release.kernel_revision,
              "datatypes": ",".join(dtypes), "declared_shapes": shapes,
              "strict_shapes": str(service.config.strict_shapes).lower()}
    return {"name": name, "platform": "tileship", "backend": "tileship", "runtime": "",
            "version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": 0,
            "input": _tensors(ins, inputs=True), "output": _tensors(outs, inputs=False),
            "instance_group": [{"name": name, "kind": "KIND_CPU" if device == "cpu" else "KIND_GPU",
                                "count": max(1, service.config.worker_threads)}],
            "default_model_filename": "", "parameters": {k: {"string_value": v} for k, v in params.items()}}


def config_of(service: Service, name: str, version: str | None, protocol: str = "rest") -> dict[str, Any]:
    """``model_config`` of ``name`` (and ``version`` when given); HTTPException 503/404 as ``stat_rows``, and
    as ``check_loaded`` for an unloaded model."""
    cur = served(service)
    known(cur, name)
    _versions(service, cur, name, version)
    check_loaded(service, name, version, protocol)
    return model_config(service, cur, name)


async def config(request: Request) -> Response:
    return JSONResponse(config_of(request.app.state.service, request.path_params["name"],
                                  request.path_params.get("version")))


def unload_model(service: Service, name: str) -> None:
    """Stop serving ``name`` until it is loaded again. HTTPException 503 not ready, 404 unknown."""
    cur = served(service)
    known(cur, name)
    if name not in service.unloaded:
        service.unloaded.add(name)
        service.log.event("unload", model=name, version=cur.release_id)


async def unload(request: Request) -> Response:
    """Stop serving one model (Triton's repository unload). 200 ``{}`` as Triton; 404 for an unknown name."""
    dependents = _parameters(await read_body(request)).get("unload_dependents", False)
    if not isinstance(dependents, bool):
        raise HTTPException(400, f"unload_dependents must be true or false, not {short(dependents)}")
    unload_model(request.app.state.service, request.path_params["name"])
    return JSONResponse({})


def check_load_parameters(keys: Iterable[str]) -> None:
    """HTTPException 400 for the load overrides tileship does not take (a config, files)."""
    if any(k == "config" or k.startswith("file:") for k in keys):
        raise HTTPException(400, "load with a config or files override is not supported: tileship serves the release "
                                 "its source names; change the source and load again")


async def load_model(service: Service, name: str, trigger: str) -> tuple[int, dict[str, Any]]:
    """Re-read the source (as a repository reload) and serve ``name`` again: the reload's (status, body).

    A failed reload (409) leaves the model unloaded; a name the release (old or new) does not
    serve raises HTTPException 404."""
    status, body = await service.reload(trigger=trigger)
    cur = service.holder.current
    if cur is not None:
        known(cur, name)
    if status == 200 and name in service.unloaded:
        service.unloaded.discard(name)
        service.log.event("load", model=name, version=cur.release_id if cur else None)
    return status, body


async def load(request: Request) -> Response:
    """``load_model`` over REST: 200 with the reload's body, its 409 when it failed."""
    check_load_parameters(_parameters(await read_body(request)))
    status, body = await load_model(request.app.state.service, request.path_params["name"], "http")
    return JSONResponse(body, status_code=status)


async def read_body(request: Request) -> bytes:
    """A control route's body (``serve.body.control_body``); its BadRequest as an HTTPException."""
    try:
        return await control_body(request)
    except BadRequest as exc:
        raise HTTPException(exc.status, exc.message) from None


def _parameters(raw: bytes) -> dict[str, Any]:
    """``parameters`` of a load/unload body (empty for no body); 400 for a body not that, or with a key twice."""
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise HTTPException(400, "the body must be JSON: {\"parameters\": {...}}") from None
    twice = strict_json.duplicate_key(raw, body)
    if twice:  # orjson takes the last of two equal keys: a body that says two things is refused
        raise HTTPException(400, f"the body is refused: {twice}")
    params = body.get("parameters", {}) if isinstance(body, dict) else None
    if not isinstance(params, dict):
        raise HTTPException(400, "the body must be a JSON object whose 'parameters' is an object")
    return params


def index_ready_only(raw: bytes) -> bool:
    """The ``ready`` of a REST repository-index body (False for no body); 400 for a body that is not
    ``{"ready": true|false}``."""
    try:
        body = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        body = None
    ready = body.get("ready", False) if isinstance(body, dict) else None
    if not isinstance(ready, bool):
        raise HTTPException(400, 'the repository index body must be a JSON object {"ready": true|false}, '
                                 f"got {short(raw.decode('utf-8', 'replace'))}")
    return ready


def unloaded_error(name: str, protocol: str = "rest", version: str | None = None) -> str:
    """The message of a request to an unloaded model (``version``: the one it named), naming how to load it
    over ``protocol``."""
    what = f"version {version} of model {name}" if version else f"model {name}"  # both checked: served names
    if protocol == "grpc":
        return (f"{what} is unloaded (RepositoryModelUnload) and not available; RepositoryModelLoad "
                f"(or POST /v2/repository/models/{name}/load) serves it again")
    return (f"{what} is unloaded (POST /v2/repository/models/{name}/unload) and not available; "
            f"POST /v2/repository/models/{name}/load serves it again")


class ModelUnloaded(BadRequest):
    """A request to an unloaded model, answered as Triton answers one for a model with no version loaded:
    404 / NOT_FOUND, or 503 / UNAVAILABLE when it names the version ("not at ready state")."""

    def __init__(self, name: str, protocol: str = "rest", version: str | None = None) -> None:
        super().__init__(503 if version else 404, unloaded_error(name, protocol, version))


def check_loaded(service: Service, name: str, version: str | None, protocol: str = "rest") -> None:
    """HTTPException with ``ModelUnloaded``'s status and message when ``name`` is unloaded; else nothing."""
    if name in service.unloaded:
        exc = ModelUnloaded(name, protocol, version)
        raise HTTPException(exc.status, exc.message)


def mark_index(rows: list[dict[str, Any]], unloaded: set[str]) -> list[dict[str, Any]]:
    """The repository index with unloaded models as ``UNAVAILABLE``, reason ``unloaded``."""
    for row in rows:
        if row["name"] in unloaded:
            row["state"], row["reason"] = "UNAVAILABLE", "unloaded"
    return rows
