"""Hostile gRPC inputs found by the gRPC/shm hunt, against real servers on 127.0.0.1: each test
here failed on the code before its fix (see the commit that added it)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
from test_serve import serving
from tritonclient.utils import InferenceServerException

from tileship.serve import ServeConfig
from tileship.serve.validate import RequestLimits


def _ab(n: int) -> list[tg.InferInput]:
    out = []
    for name in ("A", "B"):
        i = tg.InferInput(name, [n], "FP32")
        i.set_data_from_numpy(np.arange(n, dtype=np.float32))
        out.append(i)
    return out


def test_a_long_request_id_is_echoed_not_dropped_at_send(cpu_release_build, tmp_path: Path):
    """The response echoes the request's ``id``, which may be as long as a request may be: the send limit
    leaves it room. It used to be the output limit plus 1 MiB, so with --max-output-mib 1 a 3 MiB id ran
    the call, counted it a success, and then the client got grpc's own "Sent message larger than max"."""
    cfg = ServeConfig(source=cpu_release_build.path, grpc_port=0, diagnostics_dir=tmp_path / "diag",
                      log_stream=io.StringIO(), limits=RequestLimits(max_output_bytes=1 << 20))
    with serving(cfg) as srv:
        c = tg.InferenceServerClient(srv.grpc_url)
        try:
            n = (1 << 20) // 4  # outputs right at the limit
            rid = "i" * (3 << 20)
            res = c.infer("add", _ab(n), request_id=rid)
            assert res.get_response().id == rid
            assert res.as_numpy("C")[:3].tolist() == [0.0, 2.0, 4.0]
            with pytest.raises(InferenceServerException) as e:  # past the output limit: refused, never run
                c.infer("add", _ab(n + 1))
            assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED" and "--max-output-mib" in e.value.message()
        finally:
            c.close()
