"""The KServe Python SDK's own clients against ``tileship serve``: ``InferenceRESTClient`` (v2 protocol,
JSON and binary tensors) and ``InferenceGRPCClient``, on a real server on 127.0.0.1. The SDK runs in
its own environment (``.venv-kserve``, made by ``scripts/setup-kserve.sh``: its pins conflict with the
server's tested set), driven by ``tests/kserve_client.py``. Never skipped: ``make test`` makes the
environment, and a missing one fails."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.test_serve_limits import hostile_server

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venv-kserve" / "bin" / "python"


def test_the_kserve_sdk_clients_infer_and_see_errors(tmp_path: Path) -> None:
    assert PYTHON.exists(), f"{PYTHON} is missing: run `bash scripts/setup-kserve.sh` (make test does)"
    with hostile_server(tmp_path, grpc_port=0) as srv:
        grpc_url = srv.grpc_url
        assert grpc_url is not None
        run = subprocess.run([str(PYTHON), str(ROOT / "tests" / "kserve_client.py"), srv.url, grpc_url],
                             capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    want = [0.5, 1.5, 2.5, 3.5, 4.5]
    assert got["rest_live"] is True and got["rest_ready"] is True and got["rest_model_ready"] is True, got
    assert got["rest_json"] == {"Z": want} and got["rest_binary"] == {"Z": want}, got
    assert got["grpc_ready"] is True and got["grpc_model_ready"] is True and got["grpc_infer"] == {"Z": want}, got
    assert got["rest_unknown_model_ready"] is False and got["grpc_unknown_model_ready"] is False, got  # as Triton
    assert "404" in got["rest_unknown_model"] and "nope" in got["rest_unknown_model"], got
    assert "NOT_FOUND" in got["grpc_unknown_model"] and "nope" in got["grpc_unknown_model"], got
