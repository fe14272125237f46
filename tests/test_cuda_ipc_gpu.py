"""``serve.cuda_ipc`` and ``serve.cuda_shm.CudaRegion`` on a GPU, without the server or tritonclient
(run on the H200 host: ``python3 -m pytest -m gpu tests/test_cuda_ipc_gpu.py``). A child process
allocates with torch and exports the allocation's CUDA IPC handle (what ``torch.multiprocessing``
sends); this process opens it, reads and writes through a region, and the child checks the write."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from tileship.serve import cuda_ipc
from tileship.serve.cuda_shm import CudaRegion
from tileship.serve.shm import Ref
from tileship.serve.validate import BadRequest

pytestmark = pytest.mark.gpu

CHILD = textwrap.dedent("""
    import base64, sys, torch
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")   # 4 MiB
    torch.cuda.synchronize()
    dev, handle, size, offset, *_ = t.untyped_storage()._share_cuda_()
    assert len(handle) == 66 and handle[1:2] == b"c", handle[:2]  # torch's version and kind, then the 64 bytes
    print(base64.b64encode(handle[2:]).decode(), size, offset, flush=True)
    sys.stdin.readline()                                            # the parent wrote 42.0 at element 7
    torch.cuda.synchronize()
    print("seen", float(t[7]), flush=True)
""")


def test_open_read_write_and_close_an_allocation_of_another_process():
    import base64

    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        b64, size, offset = child.stdout.readline().split()
        handle, size, offset = base64.b64decode(b64), int(size), int(offset)
        assert size == 4 << 20  # the tensor lies at ``offset`` in the caching allocator's segment the handle names
        mapping = cuda_ipc.open_handle(handle, 0)
        assert mapping.device == 0 and mapping.size >= offset + size
        assert cuda_ipc.close(mapping, 0) is None

        torch.cuda.init()
        with pytest.raises(BadRequest, match="runs past the end of the CUDA allocation"):
            CudaRegion("big", handle, 0, mapping.size + 1)
        region = CudaRegion("r", handle, 0, offset + size)
        got = region.read(Ref("r", offset, size), "input A").view(torch.float32)
        assert torch.equal(got.cpu(), torch.arange(1 << 20, dtype=torch.float32))
        with pytest.raises(BadRequest, match="runs past the end of CUDA shared-memory region"):
            region.read(Ref("r", offset + size - 4, 8), "input A")
        twin = CudaRegion("twin", handle, 0, 64)  # the same handle again: mapped once, counted
        region.write(Ref("r", offset + 28, 4), torch.tensor([42.0], device="cuda"), "output C")
        twin.close()
        assert torch.equal(region.read(Ref("r", offset + 28, 4), "x").view(torch.float32).cpu(), torch.tensor([42.0]))
        view = region.lend(Ref("r", offset, 16), "input A")  # read in place, as a request does
        closing = threading.Thread(target=region.close)
        closing.start()
        closing.join(0.5)
        assert closing.is_alive()  # unregistering waits for the view to come back
        assert torch.equal(view.view(torch.float32).cpu(), torch.arange(4, dtype=torch.float32))  # still mapped
        region.give_back()
        closing.join(30)
        assert not closing.is_alive() and region.close_error is None
        with pytest.raises(BadRequest, match="unregistered"):
            region.read(Ref("r", 0, 4), "input A")
        out, _ = child.communicate("go\n", timeout=60)
        assert "seen 42.0" in out
    finally:
        if child.poll() is None:
            child.kill()
    with pytest.raises(cuda_ipc.IpcError, match="cuIpcOpenMemHandle failed"):
        cuda_ipc.open_handle(handle, 0)  # its process has exited
