"""A worker process of ``tileship serve --workers N``: it owns a loaded release and runs calls.

Started by the front-end (``serve.workers``) as ``python -m tileship.serve.worker FD`` with its
end of a socketpair; the wire is ``serve.worker_wire``. It loads and warms the release the
front-end names (the same ``ReleaseHolder.prepare`` as the in-process server, so the same
integrity, lock and no-JIT checks), says ``ready``, then answers one call at a time until the
socket closes. A call's inputs are views of the shared buffer (on the CPU the kernel reads
them in place; on CUDA they are copied to the device), its outputs are copied into the buffer, followed by the
inputs it updated in place (``serve.in_place``).

Start-up is timed in two parts, reported in ``ready`` and in the front-end's ``worker_ready`` log
line: ``import_s``, importing torch and TileLang (first, while the front-end sends the start
frame; TileLang only where it is installed), and ``load_s``, loading the release, then
``warm_s``, warming it up.

Exit status: 0 when told to stop or when the front-end goes away, 1 when the release could not
be loaded, 3 (``EXIT_FATAL``) after a sticky device fault: this process's device context is
poisoned, the front-end moves traffic to its standby.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from tileship.errors import CallError
from tileship.runtime.device_faults import is_sticky_fault
from tileship.serve import worker_wire as wire
from tileship.serve.answer import check_device, inputs_device, outputs_of
from tileship.serve.in_place import with_mutated

EXIT_FATAL = 3


def _load(msg: dict[str, Any]) -> Any:
    from tileship.runtime.loader import load
    from tileship.serve.holder import ReleaseHolder, Target

    o = msg["options"]
    keys = tuple(Path(k) for k in o["trusted_keys"]) if o.get("trusted_keys") is not None else None

    def loader(path: Path, reference_only: bool, evidence: str | None) -> Any:
        rel = load(path, trusted_keys=keys, drift_policy=o.get("drift_policy"),
                   allow_unverified=o.get("allow_unverified"), reference_only=reference_only,
                   expect_evidence_digest=evidence)
        from tileship.runtime.dispatch import OpRunner

        for runner in rel.ops.values():
            if isinstance(runner, OpRunner):
                runner.check_finite = bool(o.get("check_finite", True))
        return rel

    holder = ReleaseHolder(Path(msg["path"]), loader, warmup_limit=int(o.get("warmup_limit", 256)),
                           warmup_threads=int(o.get("warmup_threads", 1)))
    return holder.prepare(Target(Path(msg["path"]), bool(msg["reference_only"]), msg.get("evidence"),
                                 release_id=msg.get("release_id")))


def _call(served: Any, buf: wire.Buffer, msg: dict[str, Any]) -> dict[str, Any]:
    """Run one call; the reply frame. Exits the process (3) after a sticky fault."""
    name = msg["name"]
    runner = served.release.ops.get(name)
    if runner is None:
        return {"id": msg["id"], "status": 404, "error": f"this worker's release does not serve {name!r}"}
    device = served.devices[name]
    args = [buf.view(a) if "off" in a else wire.scalar_value(a) for a in msg["args"]]
    if device != "cpu":
        args = [a.to(device) if hasattr(a, "to") else a for a in args]
    try:
        out, decision = runner.call(*args)
        decl = served.release.declarations[name]
        declared = [n for n, *_ in decl["outputs"]]
        answered = outputs_of(name, out, len(declared))
        check_device(name, answered, inputs_device(args), declared)  # past the buffer, every output is a CPU copy
        outs = with_mutated(decl, answered, args)  # the inputs it updated in place go back too (``serve.in_place``)
        if device != "cpu":
            import torch

            torch.cuda.current_stream().synchronize()
    except CallError as exc:
        return {"id": msg["id"], "status": 400, "error": exc.message}
    except Exception as exc:
        text = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if is_sticky_fault(exc, device):
            return {"id": msg["id"], "status": 503, "error": text, "fatal": True}
        return {"id": msg["id"], "status": 500, "error": text, "traceback": traceback.format_exc()}
    off, cap = msg["out"]
    start, descs = off, []
    for o in outs:
        n = o.nbytes
        if off + n > start + cap:
            need = wire.align(sum(x.nbytes for x in outs) + wire.ALIGN * len(outs))
            return {"id": msg["id"], "need": start + need}
        descs.append(buf.put(off, o))
        off = wire.align(off + n)
    return {"id": msg["id"], "ok": True, "outs": descs,
            "decision": [decision.path, decision.reason, decision.spec_id]}


def _import_libraries() -> float:
    """Import torch and, where installed, TileLang; the seconds it took."""
    t0 = time.perf_counter()
    for name in ("torch", "tilelang"):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    return time.perf_counter() - t0


def main(fd: int) -> int:
    import_s = _import_libraries()
    sock = socket.socket(fileno=fd)
    reader = wire.Reader(sock)
    try:
        start = reader.frame()
        assert start["op"] == "start", start
        first = reader.frame()
        buf = wire.Buffer(reader.fd(), int(first["size"]))
    except (wire.PeerGone, OSError):
        return 0
    try:
        served = _load(start)
    except Exception as exc:
        text = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        wire.send(sock, {"op": "failed", "stage": "load", "error": text})
        return 1
    w = served.warm
    wire.send(sock, {"op": "ready", "release": served.release_id, "pid": os.getpid(),
                     "import_s": import_s, "load_s": served.load_seconds, "warm_s": w.seconds, "warm_calls": w.calls,
                     "warm_failures": w.failures, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
    spin_s = float(start["options"].get("spin_us", 0.0)) * 1e-6
    while True:
        try:
            msg = reader.frame_after(spin_s)  # polls ``spin_us`` for the next call before it sleeps
        except (wire.PeerGone, OSError):
            return 0
        op = msg.get("op")
        if op == "call":
            reply = _call(served, buf, msg)
            wire.send(sock, reply)
            if reply.get("fatal"):
                sock.close()
                os._exit(EXIT_FATAL)  # the device context is poisoned: nothing here may run again
        elif op == "map":
            fd_new = reader.fd()
            buf.close()
            buf = wire.Buffer(fd_new, int(msg["size"]))
        elif op == "stop":
            return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
