"""Run by ``tests/test_serve_kserve.py`` in the kserve client's own environment (``.venv-kserve``: the
KServe SDK pins ``python-dateutil<3``, which the server's tested set does not allow).

    .venv-kserve/bin/python tests/kserve_client.py HTTP_URL GRPC_HOST:PORT

Calls a running ``tileship serve`` with the KServe Python SDK's own clients, REST (v2) and gRPC, and
prints one JSON object: what each call answered. The test decides what is right.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig


def request(binary: bool, n: int = 5, model: str = "add") -> InferRequest:
    x = np.arange(n, dtype=np.float32)
    y = np.full(n, 0.5, dtype=np.float32)
    a, b = InferInput("X", [n], "FP32"), InferInput("Y", [n], "FP32")
    a.set_data_from_numpy(x, binary_data=binary)
    b.set_data_from_numpy(y, binary_data=binary)
    return InferRequest(model_name=model, infer_inputs=[a, b], request_id=f"kserve-{int(binary)}")


def outputs(resp: Any) -> dict[str, list[float]]:
    return {o.name: o.as_numpy().tolist() for o in resp.outputs}


async def main(http_url: str, grpc_url: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rest = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    try:
        out["rest_live"] = await rest.is_server_live(http_url)
        out["rest_ready"] = await rest.is_server_ready(http_url)
        out["rest_model_ready"] = await rest.is_model_ready(http_url, "add")
        out["rest_unknown_model_ready"] = await rest.is_model_ready(http_url, "nope")
        out["rest_json"] = outputs(await rest.infer(http_url, request(False), model_name="add"))
        out["rest_binary"] = outputs(await rest.infer(http_url, request(True), model_name="add"))
        try:
            await rest.infer(http_url, request(False, model="nope"), model_name="nope")
            out["rest_unknown_model"] = "answered"
        except Exception as exc:  # noqa: BLE001 -- what the SDK raises is what is recorded
            out["rest_unknown_model"] = f"{type(exc).__name__}: {exc}"
    finally:
        await rest.close()
    grpc_client = InferenceGRPCClient(grpc_url, retries=2, timeout=30)
    try:
        out["grpc_ready"] = await grpc_client.is_server_ready()
        out["grpc_model_ready"] = await grpc_client.is_model_ready("add")
        try:  # the SDK raises on any error status
            out["grpc_unknown_model_ready"] = await grpc_client.is_model_ready("nope")
        except Exception as exc:  # noqa: BLE001
            out["grpc_unknown_model_ready"] = f"{type(exc).__name__}: {exc}"
        out["grpc_infer"] = outputs(await grpc_client.infer(request(False)))
        try:
            await grpc_client.infer(request(False, model="nope"))
            out["grpc_unknown_model"] = "answered"
        except Exception as exc:  # noqa: BLE001
            out["grpc_unknown_model"] = f"{type(exc).__name__}: {exc}"
    finally:
        await grpc_client.close()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
