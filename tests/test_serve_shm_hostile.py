"""Hostile use of the shared-memory extensions found by the gRPC/shm hunt: each test here failed
on the code before its fix (see the commit that added it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import tritonclient.utils.shared_memory as shm


@pytest.fixture
def region() -> Iterator[tuple[Any, str]]:
    tag = uuid.uuid4().hex[:12]
    key = f"/tileship_test_{tag}"
    h = shm.create_shared_memory_region(f"r_{tag}", key, 4096)
    yield h, key
    shm.destroy_shared_memory_region(h)


def test_registering_regions_never_spends_the_descriptors_the_server_needs(region):
    """Each system region holds a file descriptor. Under the common soft limit (1024 by default;
    256 here), registering regions until refused must leave the process descriptors to accept
    connections and open files: the refusal is the registry's limit, never EMFILE (which, seen on
    a live server at ``ulimit -n 1024``, left REST unreachable while it still said ready)."""
    _, key = region
    script = textwrap.dedent(f"""
        import os, resource, socket
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        from tileship.serve import shm
        from tileship.serve.validate import BadRequest
        reg = shm.Regions()
        n = 0
        try:
            while True:
                reg.register(f"r{{n}}", {key!r}, 0, 64)
                n += 1
        except BadRequest as exc:
            print(type(exc).__name__, exc.status, exc.message)
        socks = [socket.socket() for _ in range(128)]  # what the server still needs: connections, files
        print("registered", n, "sockets", len(socks))
        reg.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    refusal, done = out.stdout.strip().splitlines()[-2:]
    assert refusal.startswith("RegionLimit 400 ") and "the limit" in refusal and "open files" not in refusal, refusal
    assert done.endswith("sockets 128"), done
    assert 0 < int(done.split()[1]) <= 64, done


def test_past_the_region_limit_grpc_says_resource_exhausted_and_rest_400(grpc_server, region, monkeypatch):
    import tritonclient.grpc as tg
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    from tileship.serve import shm as server_shm

    _, key = region
    monkeypatch.setattr(server_shm, "MAX_REGIONS", 2)
    gc = tg.InferenceServerClient(grpc_server.grpc_url)
    hc = th.InferenceServerClient(grpc_server.url.removeprefix("http://"))
    try:
        gc.register_system_shared_memory("one", key, 64)
        hc.register_system_shared_memory("two", key, 64)
        for register, status in ((gc.register_system_shared_memory, "StatusCode.RESOURCE_EXHAUSTED"),
                                 (hc.register_system_shared_memory, "400")):
            with pytest.raises(InferenceServerException) as e:
                register("three", key, 64)
            assert e.value.status() == status and "2 shared-memory regions are registered, the limit" in \
                e.value.message(), (e.value.status(), e.value.message())
        assert sorted(gc.get_system_shared_memory_status(as_json=True)["regions"]) == ["one", "two"]
    finally:
        gc.unregister_system_shared_memory()
        gc.close()
        hc.close()


def test_an_input_read_in_several_parts_is_read_whole(grpc_server, monkeypatch):
    """A read of a region may return fewer bytes than asked for without the file having shrunk: Linux returns at
    most 2 GiB - 4 KiB per read, so an input window over 2 GiB always came back short. The server took any short
    read for a truncated file and answered 400 `shrank ... register it again` to a request that was right. Here
    each read is capped at 1000 bytes (what the kernel does past 2 GiB): the inputs are read whole, in parts."""
    import numpy as np
    import tritonclient.http as th

    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: real(fd, [memoryview(buffers[0])[:1000]], offset))
    tag = uuid.uuid4().hex[:12]
    key = f"/tileship_test_{tag}"
    h = shm.create_shared_memory_region(f"r_{tag}", key, 8192)
    a, b = np.arange(1024, dtype=np.float32), np.full(1024, 0.5, dtype=np.float32)
    shm.set_shared_memory_region(h, [a, b])
    c = th.InferenceServerClient(grpc_server.url.removeprefix("http://"))
    try:
        c.register_system_shared_memory("parts", key, 8192)
        ins = [th.InferInput("A", [1024], "FP32"), th.InferInput("B", [1024], "FP32")]
        ins[0].set_shared_memory("parts", 4096)
        ins[1].set_shared_memory("parts", 4096, offset=4096)
        np.testing.assert_array_equal(c.infer("add", ins).as_numpy("C"), a + b)
    finally:
        c.unregister_system_shared_memory()
        c.close()
        shm.destroy_shared_memory_region(h)
