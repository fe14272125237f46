"""Triton's CUDA shared memory extension in `tileship serve` (issue 16, item 3), the parts a machine
without a GPU can check: every malformed or impossible registration gets a 4xx naming the field,
over REST (httpx and tritonclient.http) and gRPC (tritonclient.grpc), without disturbing the system
regions that share the namespace; a server with worker processes refuses CUDA regions; and the
request path (``shm_requests.attach`` -> ``protocol.to_tensor`` -> the encoder) hands a CUDA region's bytes
to the call and its outputs back as device tensors. The real IPC path runs on the H200:
tests/test_serve_cuda_shm_gpu.py."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as tg
import tritonclient.http as th
import tritonclient.utils.shared_memory as sysshm
from tritonclient.utils import InferenceServerException

from tileship.serve import call_plan, protocol, shm, shm_requests
from tileship.serve.cuda_shm import raw_handle
from tileship.serve.plans import Plans
from tileship.serve.validate import BadRequest

HANDLE = base64.b64encode(bytes(range(64))).decode()


@pytest.fixture(scope="module")
def server(grpc_server):
    return grpc_server


@pytest.fixture
def rest(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30.0) as c:
        yield c
        c.post("/v2/systemsharedmemory/unregister")


def _register(rest: httpx.Client, name: str, body: Any) -> httpx.Response:
    return rest.post(f"/v2/cudasharedmemory/region/{name}/register", json=body)


def test_metadata_claims_cuda_shared_memory_only_with_a_gpu(rest, server):
    ext = rest.get("/v2").json()["extensions"]
    assert "system_shared_memory" in ext
    assert ("cuda_shared_memory" in ext) == torch.cuda.is_available()
    gc = tg.InferenceServerClient(server.grpc_url)
    assert list(gc.get_server_metadata().extensions) == ext
    gc.close()


@pytest.mark.parametrize(("body", "words"), [
    ({"device_id": 0, "byte_size": 16}, "must be a JSON object"),
    ({"raw_handle": HANDLE, "device_id": 0, "byte_size": 16}, 'raw_handle must be {"b64"'),
    ({"raw_handle": {"b64": "not base64!"}, "device_id": 0, "byte_size": 16}, "raw_handle.b64 is not base64"),
    ({"raw_handle": {"b64": base64.b64encode(b"short").decode()}, "device_id": 0, "byte_size": 16}, "got 5 bytes"),
    ({"raw_handle": {"b64": HANDLE}, "device_id": -1, "byte_size": 16}, "device_id must be a non-negative integer"),
    ({"raw_handle": {"b64": HANDLE}, "device_id": "0", "byte_size": 16}, "device_id must be a non-negative integer"),
    ({"raw_handle": {"b64": HANDLE}, "device_id": 0, "byte_size": 0}, "byte_size must be at least 1"),
    ({"raw_handle": {"b64": HANDLE}, "device_id": 0, "byte_size": 10**400}, "malformed JSON"),
    ([1, 2], "must be a JSON object"),
])
def test_rest_register_refuses_a_malformed_body(rest, body, words):
    r = _register(rest, "bad", body)
    assert r.status_code == 400 and words in r.json()["error"], r.text
    assert rest.get("/v2/cudasharedmemory/status").json() == []


def test_a_well_formed_handle_that_opens_nothing_is_a_400(rest):
    r = _register(rest, "nogpu", {"raw_handle": {"b64": HANDLE}, "device_id": 0, "byte_size": 16})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "region 'nogpu'" in err or "region nogpu" in err
    if not torch.cuda.is_available():
        assert "needs a GPU" in err
    else:  # 64 bytes of 0..63 are no exported allocation
        assert "cannot be opened" in err
    assert rest.get("/v2/cudasharedmemory/status").json() == []


def test_status_and_unregister_of_unknown_regions(rest):
    assert rest.get("/v2/cudasharedmemory/status").json() == []
    r = rest.get("/v2/cudasharedmemory/region/nope/status")
    assert r.status_code == 404 and "unknown shared-memory region" in r.json()["error"]
    r = rest.post("/v2/cudasharedmemory/region/nope/unregister")
    assert r.status_code == 404 and "none is registered" in r.json()["error"]
    assert rest.post("/v2/cudasharedmemory/unregister").status_code == 200


def test_the_kinds_share_one_namespace_and_keep_apart(rest):
    key = f"/tileship_cuda_test_{uuid.uuid4().hex[:10]}"
    h = sysshm.create_shared_memory_region("sys1", key, 64)
    try:
        assert rest.post("/v2/systemsharedmemory/region/sys1/register",
                         json={"key": key, "byte_size": 64}).status_code == 200
        r = _register(rest, "sys1", {"raw_handle": {"b64": HANDLE}, "device_id": 0, "byte_size": 16})
        assert r.status_code == 409 and "already registered (system)" in r.json()["error"]
        r = rest.get("/v2/cudasharedmemory/region/sys1/status")
        assert r.status_code == 400 and "is a system region, not a cuda one" in r.json()["error"]
        r = rest.post("/v2/cudasharedmemory/region/sys1/unregister")
        assert r.status_code == 400 and "/v2/systemsharedmemory" in r.json()["error"]
        assert rest.post("/v2/cudasharedmemory/unregister").status_code == 200  # every CUDA region: none
        assert [x["name"] for x in rest.get("/v2/systemsharedmemory/status").json()] == ["sys1"]
        assert rest.get("/v2/cudasharedmemory/status").json() == []
    finally:
        rest.post("/v2/systemsharedmemory/unregister")
        sysshm.destroy_shared_memory_region(h)


def test_tritonclient_http_and_grpc_get_clear_errors(server):
    hc = th.InferenceServerClient(f"127.0.0.1:{server.port}")
    gc = tg.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="raw_handle must be the 64 bytes"):
            gc.register_cuda_shared_memory("g", base64.b64encode(b"x" * 10), 0, 16)
        with pytest.raises(InferenceServerException) as err:
            hc.register_cuda_shared_memory("h", HANDLE, 0, 16)
        assert "region 'h'" in str(err.value) or "region h" in str(err.value)
        with pytest.raises(InferenceServerException, match="unknown shared-memory region"):
            gc.unregister_cuda_shared_memory("g")
        assert hc.get_cuda_shared_memory_status() == []
        assert len(gc.get_cuda_shared_memory_status().regions) == 0
    finally:
        hc.close()
        gc.close()


def test_with_worker_processes_cuda_regions_are_refused():
    regions = shm.Regions(cuda_off="it runs with --workers N")
    with pytest.raises(BadRequest, match="CUDA shared memory is off in this server: it runs with --workers N") as e:
        regions.register_cuda("r", bytes(64), 0, 16)
    assert e.value.status == 400


def test_raw_handle_decodes_only_base64_objects():
    assert raw_handle({"b64": HANDLE}, "r") == bytes(range(64))
    for bad in ({"b64": 5}, {"b": HANDLE}, None, HANDLE):
        with pytest.raises(BadRequest):
            raw_handle(bad, "r")


# -- the request path with a stand-in for the device window (the real one: the GPU test) --------

class DeviceWindow:
    """A region of kind "cuda" over a tensor: what ``cuda_shm.CudaRegion`` does, minus CUDA IPC."""

    kind = "cuda"

    def __init__(self, name: str, nbytes: int) -> None:
        self.name, self.mem, self.reads, self.lent = name, torch.zeros(nbytes, dtype=torch.uint8), 0, 0

    def check(self, ref: shm.Ref, where: str) -> None:
        if ref.offset + ref.byte_size > self.mem.numel():
            raise BadRequest(400, f"{where}: past the end")

    def read(self, ref: shm.Ref, where: str) -> torch.Tensor:
        self.reads += 1
        return self.mem[ref.offset:ref.offset + ref.byte_size].clone()

    def lend(self, ref: shm.Ref, where: str) -> torch.Tensor:
        self.check(ref, where)
        self.lent += 1
        return self.mem[ref.offset:ref.offset + ref.byte_size]

    def give_back(self) -> None:
        self.lent -= 1

    def write(self, ref: shm.Ref, data: Any, where: str) -> None:
        self.mem[ref.offset:ref.offset + ref.byte_size].copy_(data.reshape(-1).view(torch.uint8))

    def close(self) -> None:
        pass


def test_attach_fetches_cuda_inputs_at_call_time_and_keeps_outputs_on_the_device():
    regions = shm.Regions()
    win = DeviceWindow("dev", 64)
    regions._add("dev", lambda: win)
    a = torch.arange(4, dtype=torch.float32)
    win.mem[16:32].copy_(a.view(torch.uint8))
    inp = protocol.InputTensor("A", "FP32", (4,), shm=shm.Ref("dev", 16, 16))
    req = protocol.InferRequest(None, [inp], [("C", True)], True, shm_outputs={"C": shm.Ref("dev", 48, 16)})
    seen: dict[str, Any] = {}
    encode = shm_requests.attach(regions, req, lambda **kw: seen.update(kw) or "encoded")
    assert win.lent == 0 and inp.raw is None  # nothing read before the call runs
    assert encode.device_outputs == frozenset({"C"})
    t = protocol.to_tensor(inp, "cpu")
    assert win.lent == 1 and torch.equal(t, a)
    assert t.data_ptr() == win.mem[16:].data_ptr()  # read in place: no copy
    out = t * 2
    assert encode(outputs=[("C", out, True)], model="m") == "encoded"
    assert torch.equal(win.mem[48:64].view(torch.float32), out)
    assert seen["shm"] == {"C": {"shared_memory_region": "dev", "shared_memory_byte_size": 16,
                                 "shared_memory_offset": 48}}
    with pytest.raises(BadRequest, match="byte size mismatch: output C"):
        encode(outputs=[("C", torch.zeros(5), True)], model="m")
    assert np.array_equal(win.mem[16:32].view(torch.float32).numpy(), a.numpy())  # the input is untouched
    encode.leases.release()  # what calls.execute does once the call has finished
    assert win.lent == 0
    odd = protocol.InputTensor("A", "FP32", (2,), shm=shm.Ref("dev", 18, 8))  # no float32 view starts there
    win.mem[18:26].copy_(torch.tensor([1.5, -2.0]).view(torch.uint8))
    plain = shm_requests.attach(regions, protocol.InferRequest(None, [odd], [("C", True)], True), lambda **kw: None)
    assert torch.equal(protocol.to_tensor(odd, "cpu"), torch.tensor([1.5, -2.0]))  # a copy, correct
    plain.leases.release()
    assert win.lent == 0
    bad = protocol.InferRequest(None, [protocol.InputTensor("A", "FP32", (4,), shm=shm.Ref("dev", 56, 16))],
                                [("C", True)], True)
    with pytest.raises(BadRequest, match="input A: past the end"):
        shm_requests.attach(regions, bad, lambda **kw: None)


def test_an_input_updated_in_place_is_copied_out_of_its_cuda_window_before_the_call():
    """The server never writes a client's input region: K, which the operator updates in place, reaches the call as
    a copy of its window (planned afresh or from a kept plan), V, which it only reads, as the window itself (no
    copy); after the update the window still holds what the client put there. Was: K was the window, so the call
    wrote the client's input region."""
    decl: dict[str, Any] = {"inputs": [["K", ["N"]], ["V", ["N"]]], "outputs": [], "mutates": ["K"],
                            "dtypes": ["float32"], "shapes": [{"N": 4}]}
    regions = shm.Regions()
    win = DeviceWindow("dev", 32)
    regions._add("dev", lambda: win)
    k, v = torch.arange(4, dtype=torch.float32), torch.full((4,), 10.0)
    win.mem[:16].copy_(k.view(torch.uint8))
    win.mem[16:].copy_(v.view(torch.uint8))
    plans = Plans()
    for planned in range(3):  # plan_call's plan, then Plans' first and kept ones
        ins = [protocol.InputTensor("K", "FP32", (4,), shm=shm.Ref("dev", 0, 16)),
               protocol.InputTensor("V", "FP32", (4,), shm=shm.Ref("dev", 16, 16))]
        req = protocol.InferRequest(None, ins, [], True)
        encode = shm_requests.attach(regions, req, lambda **kw: None)
        plan = call_plan.plan_call(req, "kv", decl) if planned == 0 else plans.plan(req, "kv", decl)
        kt, vt = plan.arguments("cpu")
        assert vt.data_ptr() == win.mem[16:].data_ptr()  # read in place: no copy
        assert kt.untyped_storage().data_ptr() != win.mem.untyped_storage().data_ptr()
        kt.add_(vt)  # the call's update, in place
        assert torch.equal(kt, k + v)
        assert torch.equal(win.mem[:16].view(torch.float32), k), planned  # the client's input is untouched
        encode.leases.release()
        assert win.lent == 0
