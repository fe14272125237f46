"""A request's tensors in shared memory (Triton's extensions; the regions are ``serve.shm``'s).

    check_sizes  before anything is read or run: each shared-memory output's byte size against the size the
             declaration fixes for the call (400)
    attach   a parsed request's shared-memory inputs -> their bytes (system regions; CUDA inputs are
             lent in place when the call runs); its outputs -> an Encoder that writes them into their
             regions first (``calls.run`` calls it for REST and gRPC)
    Leases   the CUDA windows one request reads in place and the pooled host blocks its system inputs
             were copied into, given back when its call has ended
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tileship.declare.outputs_at import described_outputs_at
from tileship.serve.shm import BYTE_SIZE, OFFSET, REGION, Ref, Regions
from tileship.serve.validate import BadRequest

if TYPE_CHECKING:
    from tileship.serve.protocol import InferRequest


class Leases:
    """The CUDA windows one request reads in place: ``take`` lends a view (``CudaRegion.lend``) and
    records it; ``hold`` keeps a system output region open (``Region.hold``); ``keep`` records a pooled
    block (``serve.staging.Lease``); ``release`` gives every one back, once the call has finished on the
    device and its outputs are written."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[Any] = []
        self._blocks: list[Any] = []

    def keep(self, block: Any) -> None:
        with self._lock:
            self._blocks.append(block)

    @property
    def empty(self) -> bool:
        return not self._held and not self._blocks

    def hold(self, region: Any, ref: Ref, where: str) -> Any:
        """Hold the system region ``ref`` will be written into (``Region.hold``) until ``release``: an
        unregister meanwhile leaves it open for this request; ``region`` returned."""
        region.hold(ref, where)
        with self._lock:
            self._held.append(region)
        return region

    def take(self, region: Any, ref: Ref, where: str) -> Any:
        view = region.lend(ref, where)
        with self._lock:
            self._held.append(region)
        return view

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, []
            blocks, self._blocks = self._blocks, []
        for region in held:
            region.give_back()
        for block in blocks:
            block.give_back()


def check_sizes(req: InferRequest, decl: Mapping[str, Any], plan: Any, sizes: Mapping[str, int]) -> None:
    """BadRequest 400 for a shared-memory output whose ``shared_memory_byte_size`` is not the size the operator's
    declaration fixes for this call (``sizes``: ``call_plan.output_bytes`` of ``plan``, a ``CallPlan``), before
    any region is read and without running the call (with ``--workers N``, without taking a worker). An output
    whose size the declaration leaves open (a whole model, a dim it cannot tell) is checked when it is written."""
    for name, ref in req.shm_outputs.items():
        if (nbytes := sizes.get(name)) is None or nbytes == ref.byte_size:
            continue
        out = next((o for o in described_outputs_at(decl, plan.dims, plan.dtype) if o.name == name), None)
        what = f"{list(out.shape or ())} x {out.dtype} = " if out is not None else ""
        raise BadRequest(400, f"byte size mismatch: output {name} is {what}{nbytes} bytes but {BYTE_SIZE} is "
                              f"{ref.byte_size}")


def attach(regions: Regions, req: InferRequest, encode: Any, pool: Any = None) -> Any:
    """Copy ``req``'s system shared-memory inputs out of their regions, into blocks of ``pool`` where it
    lends one (``serve.staging.Pool``: reused, and page-locked with a GPU, so neither the read nor the copy
    to the device faults in fresh pages), else into fresh buffers (CUDA ones get a ``fetch``
    that lends their window in place when the call runs) and check every shared-memory output's
    window; the Encoder to use: ``encode`` itself when nothing goes through shared memory, else a
    wrapper that writes the shared-memory outputs into their regions (a device output to a system region
    through a block of ``pool``) and hands ``encode`` their
    parameters (``shm=``) instead of their data. The wrapper's ``device_outputs`` names the outputs
    it wants as device tensors (those bound for CUDA regions), its ``kinds`` the kinds of region the
    request uses ("cuda", "system", or both, comma-separated), and its ``leases`` (a ``Leases``)
    must be released by the caller once the call has finished on the device, whatever happened
    (``calls.execute`` does). Raises BadRequest (400/404)."""
    if not req.shm_outputs and all(inp.shm is None for inp in req.inputs):  # the common case: nothing to attach
        return encode
    leases = Leases()
    try:
        kinds, on_device, held = _attach_windows(regions, req, leases, pool)
    except BaseException:  # blocks taken for inputs before a later input or output was refused go back now
        leases.release()
        raise
    if not req.shm_outputs and leases.empty and all(inp.fetch is None for inp in req.inputs):
        return encode
    outs = dict(req.shm_outputs)

    def write_then_encode(**kw: Any) -> Any:
        import torch

        params: dict[str, dict[str, Any]] = {}
        for name, t, _binary in kw["outputs"]:
            ref = outs.get(name)
            if ref is None:
                continue
            nbytes = t.numel() * t.element_size()
            if nbytes != ref.byte_size:
                raise BadRequest(400, f"byte size mismatch: output {name} is {list(t.shape)} x "
                                      f"{str(t.dtype).removeprefix('torch.')} = {nbytes} bytes but {BYTE_SIZE} is "
                                      f"{ref.byte_size}")
            block = None
            if name in on_device:
                data = t
            elif t.device.type != "cpu" and pool is not None and (block := pool.take(nbytes)) is not None:
                data = block.tensor().copy_(t.detach().contiguous().reshape(-1).view(torch.uint8)).numpy()
            else:
                data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
            try:  # a system region into the one held since admission, even if unregistered since
                (held[name] if name in held else regions.region(ref, f"output {name}")).write(ref, data,
                                                                                               f"output {name}")
            finally:
                if block is not None:
                    block.give_back()
            params[name] = {REGION: ref.region, BYTE_SIZE: ref.byte_size} | ({OFFSET: ref.offset} if ref.offset else {})
        return encode(**kw, shm=params)

    write_then_encode.device_outputs = frozenset(on_device)  # type: ignore[attr-defined]
    write_then_encode.leases = leases  # type: ignore[attr-defined]
    write_then_encode.kinds = ",".join(sorted(kinds))  # type: ignore[attr-defined]
    return write_then_encode


def _attach_windows(regions: Regions, req: InferRequest, leases: Leases,
                    pool: Any) -> tuple[set[str], set[str], dict[str, Any]]:
    """``attach``'s checks and input copies: (the kinds of region used, the outputs bound for CUDA regions,
    the system regions the other outputs go to, held in ``leases``)."""
    kinds: set[str] = set()
    for inp in req.inputs:
        if inp.shm is not None:
            where = f"input {inp.name}"
            region = regions.region(inp.shm, where)
            kinds.add(region.kind)
            if region.kind == "system":
                block = None if pool is None else pool.take(inp.shm.byte_size)
                if block is None:
                    inp.raw = memoryview(region.read(inp.shm, where))
                else:
                    leases.keep(block)
                    inp.raw = region.read(inp.shm, where, into=block.view)
            else:
                region.check(inp.shm, where)
                inp.fetch = functools.partial(leases.take, region, inp.shm, where)
    on_device, held = set(), {}
    for name, ref in req.shm_outputs.items():
        region = regions.region(ref, f"output {name}")
        kinds.add(region.kind)
        if region.kind == "system":
            held[name] = leases.hold(region, ref, f"output {name}")
        else:
            region.check(ref, f"output {name}")
            on_device.add(name)
    return kinds, on_device, held
