"""`tileship serve --grpc-port` over loopback gRPC, next to the same calls in-process (issue 15, item 5).

The server is a child process (`tileship serve REL --port P --grpc-port G`); this process sends one
serialized ``ModelInferRequest`` (raw_input_contents) over a grpcio channel and takes the response
as bytes, so no client-side protobuf work is timed. Phases:

1. in-process: ``call`` (the operator on ready tensors) and ``full`` (what the server does around
   it without gRPC: parse the message, plan, tensors, call, encode the response message).
2. gRPC, one client, sequential: p50/p99 and the p50 overhead over both in-process numbers; the
   same with ``tritonclient.grpc`` (what a typical client adds, for information).
3. gRPC, ``--clients`` concurrent aio calls for ``--duration`` s (at most ``--max-requests``).
4. the floor: the same sequential client against a bare grpc.aio echo server in another process.
Then /metrics: compile attempts (must be 0). Helpers come from ``serve_load.py`` (the REST one).
When torch sees a GPU and ``--op`` has CUDA specializations, the in-process numbers run on the device
(inputs moved there once for ``call``; ``full`` moves them per call; every call synchronized).

    python benchmarks/serve_grpc_load.py --op add --dims N=4096 --out benchmarks/results/cpu/serve_grpc_load_add.json
    python benchmarks/serve_grpc_load.py --op rmsnorm_cpu --dims M=1,N=1024 --out benchmarks/results/cpu/serve_grpc_load_rmsnorm.json
"""  # noqa: E501

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import ROOT, _metric, build_cpu_release, free_port, scrape, summary_us, wait_ready  # noqa: E402


def make_request(release: Any, op: str, dims: dict[str, int], dtype: str) -> tuple[Any, list[Any]]:
    import torch
    from tritonclient.grpc import service_pb2 as pb

    from tileship.serve.encoding import KSERVE

    runner = release.ops[op]
    tensors = runner.sample_inputs(dims, dtype, "cpu", 0)
    req = pb.ModelInferRequest(model_name=op)
    for (name, _), t in zip(runner.shape.inputs, tensors, strict=True):
        req.inputs.add(name=name, datatype=KSERVE[str(t.dtype).removeprefix("torch.")], shape=list(t.shape))
        req.raw_input_contents.append(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return req, tensors


def in_process(release: Any, op: str, wire: bytes, tensors: list[Any], n: int, device: str = "cpu") -> dict[str, Any]:
    """``call``: the operator on tensors already on ``device``; ``full``: parse, tensors to the device,
    call, (synchronize,) copy back, encode. On CUDA each call is synchronized, as the server's is."""
    import torch
    from tritonclient.grpc import service_pb2 as pb

    from tileship.serve import call_plan, grpc_codec

    runner, decl = release.ops[op], release.declarations[op]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    dev_args = [t.to(device) for t in tensors]
    for _ in range(3):
        runner.call(*dev_args)
    sync()
    call_t, full_t = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        out, decision = runner.call(*dev_args)
        sync()
        call_t.append(time.perf_counter() - t0)
    for i in range(n + 3):
        t0 = time.perf_counter()
        plan = call_plan.plan_call(grpc_codec.parse(pb.ModelInferRequest.FromString(wire)), op, decl)
        out, decision = runner.call(*plan.arguments(device))
        sync()
        resp = grpc_codec.encode(model=op, version=release.release_id, request_id=None, parameters={},
                                 outputs=[(plan.outputs[0][0], out.detach().cpu(), True)]).SerializeToString()
        if i >= 3:
            full_t.append(time.perf_counter() - t0)
    return {"call": summary_us(call_t), "full": summary_us(full_t), "decision": f"{decision.path}:{decision.reason}",
            "response_bytes": len(resp), "output": out}


def sequential(target: str, wire: bytes, n: int) -> tuple[dict[str, Any], bytes]:
    import grpc

    with grpc.insecure_channel(target) as ch:
        call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        first = call(wire, timeout=60)
        for _ in range(5):
            call(wire, timeout=60)
        lat = []
        for _ in range(n):
            t0 = time.perf_counter()
            call(wire, timeout=60)
            lat.append(time.perf_counter() - t0)
    return summary_us(lat), first


_ECHO = """
import asyncio, grpc, sys
async def main():
    async def echo(req, ctx):
        return req
    s = grpc.aio.server()
    s.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", {"E": grpc.unary_unary_rpc_method_handler(echo)}),))
    print(s.add_insecure_port("127.0.0.1:0"), flush=True)
    await s.start()
    await s.wait_for_termination()
asyncio.run(main())
"""  # noqa: E501


def echo_floor(size: int, n: int) -> dict[str, Any]:
    """The same sequential client against a bare grpc.aio server (another process) that echoes the
    request: what grpcio itself costs per call on this machine, before tileship does anything."""
    import grpc

    proc = subprocess.Popen([sys.executable, "-c", _ECHO], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.unary_unary("/t.S/E")
            payload = b"x" * size
            for _ in range(20):
                call(payload, timeout=60)
            lat = []
            for _ in range(n):
                t0 = time.perf_counter()
                call(payload, timeout=60)
                lat.append(time.perf_counter() - t0)
    finally:
        proc.kill()
        proc.wait()
    return summary_us(lat)


def tritonclient_sequential(target: str, op: str, tensors: list[Any], names: list[str], n: int) -> dict[str, Any]:
    import tritonclient.grpc as tg

    from tileship.serve.encoding import KSERVE

    c = tg.InferenceServerClient(target)
    arrays = [t.numpy() for t in tensors]
    lat = []
    try:
        for i in range(n + 5):
            t0 = time.perf_counter()
            inputs = []
            for name, a, t in zip(names, arrays, tensors, strict=True):
                inputs.append(tg.InferInput(name, list(a.shape), KSERVE[str(t.dtype).removeprefix("torch.")]))
                inputs[-1].set_data_from_numpy(a)
            c.infer(op, inputs)
            if i >= 5:
                lat.append(time.perf_counter() - t0)
    finally:
        c.close()
    return summary_us(lat)


async def concurrent(target: str, wire: bytes, clients: int, duration: float, max_requests: int) -> dict[str, Any]:
    import grpc

    lat: list[float] = []
    codes: dict[str, int] = {}
    issued = 0
    t_end = time.perf_counter() + duration
    async with grpc.aio.insecure_channel(target) as ch:
        call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")

        async def worker() -> None:
            nonlocal issued
            while time.perf_counter() < t_end and issued < max_requests:
                issued += 1
                t0 = time.perf_counter()
                try:
                    await call(wire, timeout=60)
                    code = "OK"
                except grpc.aio.AioRpcError as exc:
                    code = exc.code().name
                lat.append(time.perf_counter() - t0)
                codes[code] = codes.get(code, 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
    return {"clients": clients, "duration_s": round(wall, 3), "requests": len(lat), "codes": codes,
            "errors": sum(v for k, v in codes.items() if k != "OK"),
            "throughput_rps": round(codes.get("OK", 0) / wall, 2), **summary_us(lat)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--release", type=Path, help="release directory (default: build the CPU catalog into a temp dir)")
    ap.add_argument("--op", default="add")
    ap.add_argument("--dims", default="N=4096")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--max-requests", type=int, default=20000)
    ap.add_argument("--seq", type=int, default=1000, help="sequential gRPC requests and in-process calls")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    os.environ.setdefault("TILELANG_CACHE_DIR", tempfile.mkdtemp(prefix="serve-grpc-tl-"))
    dims = {k: int(v) for k, v in (p.split("=") for p in a.dims.split(","))}

    import torch
    from tritonclient.grpc import service_pb2 as pb

    from tileship.runtime.loader import load

    release_dir = a.release or build_cpu_release(Path(tempfile.mkdtemp(prefix="serve-grpc-rel-")))
    port, gport = free_port(), free_port()
    url, target = f"http://127.0.0.1:{port}", f"127.0.0.1:{gport}"
    cmd = [sys.executable, "-c", "from tileship.cli import main; main()", "serve", str(release_dir), "--port",
           str(port), "--grpc-port", str(gport), "--max-inflight", str(max(64, a.clients * 2))]
    log_path = Path(tempfile.mkdtemp(prefix="serve-grpc-log-")) / "server.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
    try:
        ready = wait_ready(url, proc, 600)
        release = load(release_dir)
        device = (
            "cuda"
            if torch.cuda.is_available()
            and any(e.spec is not None and e.spec.target != "c" for e in release.ops[a.op].entries)
            else "cpu"
        )
        req, tensors = make_request(release, a.op, dims, a.dtype)
        wire = req.SerializeToString()
        inproc = in_process(release, a.op, wire, tensors, a.seq, device)
        ref = inproc.pop("output")
        seq, first = sequential(target, wire, a.seq)
        resp = pb.ModelInferResponse.FromString(first)
        got = torch.frombuffer(bytearray(resp.raw_output_contents[0]),
                               dtype=ref.dtype).reshape(list(resp.outputs[0].shape))
        diff = float((got.double() - ref.double().cpu()).abs().max())  # the in-process output may be on the GPU
        names = [n for n, _ in release.ops[a.op].shape.inputs]
        triton = tritonclient_sequential(target, a.op, tensors, names, min(a.seq, 300))
        loaded = asyncio.run(concurrent(target, wire, a.clients, a.duration, a.max_requests))
        floor = echo_floor(len(wire), a.seq)
        metrics = scrape(url)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    compiles = _metric(metrics, "tileship_serve_compile_attempts")
    result = {
        "benchmark": "serve_grpc_load",
        "config": {"op": a.op, "dims": dims, "dtype": a.dtype, "clients": a.clients, "duration_s": a.duration,
                   "seq": a.seq, "request_bytes": len(wire), "response_bytes": inproc["response_bytes"]},
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
                        "platform": platform.platform(), "grpcio": __import__("grpc").__version__, "device": device,
                        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
                        "load_average_1m": round(os.getloadavg()[0], 2)},
        "release_id": release.release_id, "ready": {k: ready.get(k) for k in ("ready", "reason", "device")},
        "in_process": inproc, "grpc_sequential": seq, "tritonclient_grpc_sequential": triton, "grpc_load": loaded,
        "grpc_echo_floor": floor,
        "overhead_p50_us": {"vs_in_process_full": round(seq["p50_us"] - inproc["full"]["p50_us"], 1),
                            "vs_in_process_call": round(seq["p50_us"] - inproc["call"]["p50_us"], 1)},
        "max_abs_diff_grpc_vs_in_process": diff, "compile_attempts": compiles,
    }
    result["ok"] = loaded["errors"] == 0 and compiles == 0 and diff == 0.0
    ip = inproc
    print(f"serve_grpc_load: {a.op} {dims} {a.dtype} on {device}; request {len(wire)} B; release {release.release_id}")
    print(f"  in-process call only          p50 {ip['call']['p50_us']:>9.1f} us  p99 {ip['call']['p99_us']:>9.1f} us "
          f"({ip['decision']})")
    print(f"  in-process parse+call+encode  p50 {ip['full']['p50_us']:>9.1f} us  p99 {ip['full']['p99_us']:>9.1f} us")
    print(f"  gRPC 1 client (raw bytes)     p50 {seq['p50_us']:>9.1f} us  p99 {seq['p99_us']:>9.1f} us  overhead p50 "
          f"{result['overhead_p50_us']['vs_in_process_full']:.1f} us over parse+call+encode, "
          f"{result['overhead_p50_us']['vs_in_process_call']:.1f} us over the call")
    print(f"  bare grpc.aio echo, 1 client  p50 {floor['p50_us']:>9.1f} us  p99 {floor['p99_us']:>9.1f} us  (grpcio "
          "alone, same bytes)")
    print(f"  tritonclient.grpc 1 client    p50 {triton['p50_us']:>9.1f} us  p99 {triton['p99_us']:>9.1f} us")
    print(f"  gRPC {loaded['clients']} clients {loaded['duration_s']} s: {loaded['requests']} requests, "
          f"{loaded['throughput_rps']} req/s, p50 {loaded['p50_us']:.1f} us, p99 {loaded['p99_us']:.1f} us, codes "
          f"{loaded['codes']}")
    print(f"  compile attempts {compiles}; max |gRPC - in-process| {diff}; load average "
          f"{result['environment']['load_average_1m']}; "
          f"ok: {result['ok']}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
