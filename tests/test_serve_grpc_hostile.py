"""Hostile gRPC inputs found by the gRPC/shm hunt, against real servers on 127.0.0.1: each test
here failed on the code before its fix (see the commit that added it)."""

from __future__ import annotations

import dataclasses
import io
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import tritonclient.grpc as tg
import tritonclient.utils.shared_memory as shm
from test_serve import fake_config, fake_release, point, serving
from tritonclient.utils import InferenceServerException

from tileship.serve import BackgroundServer, ServeConfig
from tileship.serve.validate import RequestLimits


def _ab(n: int) -> list[tg.InferInput]:
    out = []
    for name in ("A", "B"):
        i = tg.InferInput(name, [n], "FP32")
        i.set_data_from_numpy(np.arange(n, dtype=np.float32))
        out.append(i)
    return out


@pytest.fixture(scope="module")
def small_out(cpu_release_build, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    """A server of the CPU release with --max-output-mib 1."""
    cfg = ServeConfig(source=cpu_release_build.path, grpc_port=0, diagnostics_dir=tmp_path_factory.mktemp("diag"),
                      log_stream=io.StringIO(), limits=RequestLimits(max_output_bytes=1 << 20))
    with serving(cfg) as srv:
        yield srv


def test_a_long_request_id_is_echoed_not_dropped_at_send(small_out):
    """The response echoes the request's ``id``, which may be as long as a request may be: the send limit
    leaves it room. It used to be the output limit plus 1 MiB, so with --max-output-mib 1 a 3 MiB id ran
    the call, counted it a success, and then the client got grpc's own "Sent message larger than max"."""
    c = tg.InferenceServerClient(small_out.grpc_url)
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


def test_shared_memory_inputs_are_read_only_once_the_request_passed_its_checks(small_out, monkeypatch):
    """Shared-memory inputs skip the body limit (a client can register a sparse /dev/shm file of any size),
    so nothing is read from a region before the request has passed every check that needs only its header:
    the output limit, the model's names, dtypes and ranks. It used to copy the inputs first: two 1 GiB
    windows became 2 GiB of server memory and 7 s of work before the 413 (and 2^32-element inputs, an OOM)."""
    from tileship.serve import shm as server_shm

    reads: list[int] = []
    real = server_shm.Region.read
    monkeypatch.setattr(server_shm.Region, "read", lambda self, ref, *a, **k: reads.append(ref.byte_size) or
                        real(self, ref, *a, **k))
    n = (1 << 20) // 4 + 1  # one element past the output limit
    tag = uuid.uuid4().hex[:12]
    h = shm.create_shared_memory_region(f"r_{tag}", f"/tileship_test_{tag}", 8 * n)
    c = tg.InferenceServerClient(small_out.grpc_url)
    try:
        c.register_system_shared_memory("ab", f"/tileship_test_{tag}", 8 * n)
        for shape, dtype, code, words in [([n], "FP32", "RESOURCE_EXHAUSTED", "--max-output-mib"),
                                          ([1, n], "FP32", "INVALID_ARGUMENT", "wrong rank"),
                                          ([n], "INT32", "INVALID_ARGUMENT", "wrong datatype")]:
            inputs = [tg.InferInput("A", shape, dtype), tg.InferInput("B", shape, dtype)]
            inputs[0].set_shared_memory("ab", 4 * n)
            inputs[1].set_shared_memory("ab", 4 * n, offset=4 * n)
            with pytest.raises(InferenceServerException) as e:
                c.infer("add", inputs)
            assert e.value.status() == f"StatusCode.{code}" and words in e.value.message(), e.value.message()
        assert reads == []
        inputs = [tg.InferInput("A", [n - 1], "FP32"), tg.InferInput("B", [n - 1], "FP32")]
        inputs[0].set_shared_memory("ab", 4 * (n - 1))
        inputs[1].set_shared_memory("ab", 4 * (n - 1), offset=4 * n)
        assert c.infer("add", inputs).as_numpy("C").shape == (n - 1,)
        assert len(reads) == 2
    finally:
        c.unregister_system_shared_memory()
        c.close()
        shm.destroy_shared_memory_region(h)


def test_a_load_whose_client_gives_up_still_loads(tmp_path: Path):
    """RepositoryModelLoad with a deadline shorter than the load: the client gets DEADLINE_EXCEEDED, and the
    server finishes the load all the same, as it does for a REST client that hangs up. The handler's
    cancellation used to abandon the load halfway: the new release prepared and dropped (its snapshot
    never closed), the model left unloaded, the old release serving."""
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    root = tmp_path / "releases"
    p1, r1 = fake_release(root, "r1", {"dbl": double})
    p2, r2 = fake_release(root, "r2", {"dbl": double})
    link = tmp_path / "current"
    point(link, p1)
    slow = threading.Event()

    def loader(path: Any, ref: Any) -> Any:
        if slow.is_set():
            time.sleep(1.0)
        return {"r1": r1, "r2": r2}[Path(path).resolve().name]

    cfg = fake_config(tmp_path, {}, link, grpc_port=0)
    cfg = dataclasses.replace(cfg, loader=loader)
    with serving(cfg) as srv:
        c = tg.InferenceServerClient(srv.grpc_url)
        try:
            c.unload_model("dbl")
            point(link, p2)
            slow.set()
            with pytest.raises(InferenceServerException) as e:
                c.load_model("dbl", client_timeout=0.2)
            assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED", e.value.message()
            deadline = time.monotonic() + 10
            while not c.is_model_ready("dbl") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert c.is_model_ready("dbl") and c.is_server_ready()
            assert srv.service.holder.current.release_id == "r2"
            x = tg.InferInput("X", [3], "FP32")
            x.set_data_from_numpy(np.arange(3, dtype=np.float32))
            assert c.infer("dbl", [x]).as_numpy("Y").tolist() == [0.0, 2.0, 4.0]
        finally:
            c.close()
