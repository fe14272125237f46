"""Large tensors through `tileship serve` by three transports, next to the same call in-process (issue 16).

The server is a child process (`tileship serve`); this process sends the requests over raw
keep-alive HTTP/1.1 sockets (serve_load.py's client: no HTTP library needed on the GPU host).
For one operator and shape:

1. in-process (serve_load.py's): ``call``, the operator on tensors already on the device,
   synchronized; ``full``, parse the binary request + tensors to the device + call + sync +
   copy back + encode.
2. HTTP, one client, ``--seq`` sequential requests per mode of ``--modes``: p50/p99/mean.
   ``binary``      the binary tensor extension: the tensors' bytes in the request and the response
   ``system_shm``  Triton's system shared memory: inputs and the output in POSIX shared memory
                   (tritonclient.utils.shared_memory), registered with the server; the request
                   and the response are small JSON documents that name the regions
   ``cuda_shm``    Triton's CUDA shared memory: the same with device buffers shared by CUDA IPC
                   (tritonclient.utils.cuda_shared_memory; needs a GPU and cuda-python, else the
                   mode is recorded as skipped with the reason)
   Before timing, each mode's output is checked once against the in-process output (exact for
   float32 and integers; fp16/bf16 within 2e-2 + 2e-2 * max|out|); the shared-memory modes read
   it back from the output region, which they zero first.
3. Ratios with issue 16's targets, all "lower is better": binary p50 / full p50 (<= 1.3),
   cuda_shm p50 / (1.1 * call p50 + 1 ms) (<= 1.0); system_shm p50 / full p50 for information.
Then /metrics: compile attempts (must be 0). Exit 0 when every mode that ran answered 200 and
passed its check and nothing compiled; the ratio targets are reported, not enforced.
Every region is unregistered and destroyed at the end of its mode, also when the mode fails.

    # CPU (builds the CPU catalog when no --release is given)
    python benchmarks/serve_shm.py --op add --dims N=4096 --dtype float32 --out /tmp/serve_shm_cpu.json
    # GPU host: the 4096^3 fp16 catalog GEMM (the default there); REL is the release directory of
    #   python3 -m tileship.cli build --project benchmarks/serve_shm/tileship.toml --out /tmp/serve-shm-rel -j 16
    python3 benchmarks/serve_shm.py --release REL --op gemm --dims M=4096,N=4096,K=4096 --dtype float16 \\
        --allow-unverified --out out/serve_shm_gpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import (  # noqa: E402
    ROOT,
    Conn,
    _max_diff,
    _metric,
    build_cpu_release,
    free_port,
    http_phase,
    in_process,
    make_request,
    ready_release,
    scrape,
    start_server,
    stop_server,
)

MODES = ("binary", "system_shm", "cuda_shm")
HOST = "127.0.0.1"
WARM = 3  # untimed requests per mode after the check, before the timed ones
GPU_DEFAULT = ("gemm", "M=4096,N=4096,K=4096", "float16")  # (--op, --dims, --dtype) where torch sees a GPU
CPU_DEFAULT = ("add", "N=4096", "float32")  # elsewhere: the CPU catalog's add


# -- tensors and tolerances ------------------------------------------------------------------------

def tolerance(ref: Any) -> float:
    """The largest |HTTP - in-process| accepted for the output ``ref`` (a CPU tensor): 0 for float32,
    float64 and integers (the server runs the same kernel on the same inputs); 2e-2 + 2e-2 * max|ref|
    for float16 and bfloat16."""
    import torch

    if ref.dtype in (torch.float16, torch.bfloat16):
        return 2e-2 + 2e-2 * float(ref.double().abs().max())
    return 0.0


def nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size())


def to_numpy(t: Any) -> Any:
    """A contiguous numpy copy of the CPU tensor ``t``'s bytes; bfloat16 (which numpy lacks) as int16."""
    import torch

    t = t.detach().cpu().contiguous()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


def np_dtype(t: Any) -> Any:
    """The numpy dtype ``to_numpy`` gives the tensor ``t``."""
    return to_numpy(t.reshape(-1)[:0]).dtype


def from_numpy(a: Any, dtype: Any) -> Any:
    """The numpy array ``a`` (as ``to_numpy`` makes them) as a CPU tensor of ``dtype``, copied."""
    import torch

    t = torch.from_numpy(a.copy())
    return t.view(dtype) if t.dtype != dtype else t


# -- the two shared-memory flavours ------------------------------------------------------------------

class SystemShm:
    """POSIX shared memory through tritonclient.utils.shared_memory (one /dev/shm object per region)."""

    prefix = "/v2/systemsharedmemory"

    def __init__(self) -> None:
        import tritonclient.utils.shared_memory as shm

        self.shm = shm

    def create(self, name: str, size: int) -> Any:
        return self.shm.create_shared_memory_region(name, f"/{name}", size)

    def fill(self, handle: Any, t: Any) -> None:
        self.shm.set_shared_memory_region(handle, [to_numpy(t)])

    def read(self, handle: Any, like: Any) -> Any:
        """The region's first bytes as a CPU tensor of ``like``'s dtype and shape (a copy)."""
        return from_numpy(self.shm.get_contents_as_numpy(handle, np_dtype(like), list(like.shape)), like.dtype)

    def register_body(self, name: str, handle: Any, size: int) -> dict[str, Any]:
        return {"key": f"/{name}", "offset": 0, "byte_size": size}

    def destroy(self, handle: Any) -> None:
        self.shm.destroy_shared_memory_region(handle)


class CudaShm:
    """CUDA device buffers shared by IPC handle, through tritonclient.utils.cuda_shared_memory.
    Constructing one raises RuntimeError (with the reason) without a GPU or without cuda-python."""

    prefix = "/v2/cudasharedmemory"

    def __init__(self, device_id: int) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda is not available (no GPU on this machine)")
        try:
            import tritonclient.utils.cuda_shared_memory as cshm
        except (ImportError, RuntimeError) as exc:  # the module raises RuntimeError without cuda-python
            raise RuntimeError(f"tritonclient.utils.cuda_shared_memory cannot be imported: {exc}") from None
        self.cshm, self.device_id = cshm, device_id

    def create(self, name: str, size: int) -> Any:
        return self.cshm.create_shared_memory_region(name, size, self.device_id)

    def fill(self, handle: Any, t: Any) -> None:
        self.cshm.set_shared_memory_region_from_dlpack(handle, [t.contiguous().to(f"cuda:{self.device_id}")])

    def read(self, handle: Any, like: Any) -> Any:
        return from_numpy(self.cshm.get_contents_as_numpy(handle, np_dtype(like), list(like.shape)), like.dtype)

    def register_body(self, name: str, handle: Any, size: int) -> dict[str, Any]:
        return {"raw_handle": {"b64": self.cshm.get_raw_handle(handle).decode()}, "device_id": self.device_id,
                "byte_size": size}

    def destroy(self, handle: Any) -> None:
        self.cshm.destroy_shared_memory_region(handle)


def post_json(url: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
    """POST ``body`` as JSON (an empty body when None) to ``url``; (status, the answer's text).
    An HTTP error status is returned, not raised; a connection failure raises OSError."""
    data = b"" if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


class Regions:
    """The regions of one mode, as a context manager: ``add`` creates a region and registers it
    with the server (raising RuntimeError with the server's answer when refused); on exit every
    registered region is unregistered and every created one destroyed, whatever failed before.
    Failures of the clean-up itself are kept in ``cleanup_errors`` (they do not raise)."""

    def __init__(self, flavour: SystemShm | CudaShm, url: str) -> None:
        self.flavour, self.url = flavour, url
        self.created: list[Any] = []
        self.registered: list[str] = []
        self.cleanup_errors: list[str] = []

    def __enter__(self) -> Regions:
        return self

    def add(self, name: str, size: int) -> Any:
        handle = self.flavour.create(name, size)
        self.created.append(handle)
        status, text = post_json(f"{self.url}{self.flavour.prefix}/region/{name}/register",
                                 self.flavour.register_body(name, handle, size))
        if status != 200:
            raise RuntimeError(f"registering region {name} ({size} bytes) answered {status}: {text[:500]}")
        self.registered.append(name)
        return handle

    def __exit__(self, *exc: object) -> None:
        for name in self.registered:
            try:
                status, text = post_json(f"{self.url}{self.flavour.prefix}/region/{name}/unregister")
                if status != 200:
                    self.cleanup_errors.append(f"unregister {name}: {status} {text[:200]}")
            except OSError as e:
                self.cleanup_errors.append(f"unregister {name}: {e}")
        for handle in self.created:
            try:
                self.flavour.destroy(handle)
            except Exception as e:  # noqa: BLE001 (destroy every region even when one fails)
                self.cleanup_errors.append(f"destroy: {type(e).__name__}: {e}")


# -- the modes ---------------------------------------------------------------------------------------

async def check_and_time(port: int, path: str, body: bytes, headers: dict[str, str], n: int,
                         check: Any) -> tuple[Any, dict[str, Any]]:
    """One request whose (status, headers, body) goes to ``check`` (its result is returned first),
    ``WARM`` untimed ones, then ``n`` timed sequential ones on one keep-alive connection
    (serve_load.http_phase's summary: p50_us, p99_us, mean_us, errors, codes, paths)."""
    conn = Conn(HOST, port)
    try:
        checked = check(*await conn.post(path, body, headers))
    finally:
        conn.close()
    await http_phase(HOST, port, path, body, headers, 1, 60.0, WARM)
    return checked, await http_phase(HOST, port, path, body, headers, 1, 600.0, n)


def binary_mode(port: int, op: str, body: bytes, headers: dict[str, str], ref: Any, n: int) -> dict[str, Any]:
    """The binary tensor extension: ``body`` (serve_load.make_request's) ``n`` times; the first
    response's output compared with ``ref``."""

    def check(status: int, hdrs: dict[str, str], data: bytes) -> dict[str, Any]:
        if status != 200:
            raise RuntimeError(f"the first request answered {status}: {data[:500]!r}")
        diff = _max_diff(status, hdrs, data, ref)
        return {"max_abs_diff": diff, "tolerance": tolerance(ref), "passed": diff <= tolerance(ref)}

    checked, seq = asyncio.run(check_and_time(port, f"/v2/models/{op}/infer", body, headers, n, check))
    return {"request_bytes": len(body), "check": checked, **seq}


def shm_mode(flavour: SystemShm | CudaShm, url: str, port: int, op: str, inputs: list[tuple[str, Any]],
             out_name: str, ref: Any, n: int) -> dict[str, Any]:
    """Inputs (name, CPU tensor) and the output in regions of ``flavour``, one region each, registered
    with the server at ``url``; a JSON request naming them ``n`` times. The output region is zeroed,
    then read back after the first request and compared with ``ref``. The regions are unregistered
    and destroyed before returning or raising."""
    from tileship.serve.protocol import KSERVE

    tag = uuid.uuid4().hex[:8]
    with Regions(flavour, url) as regions:
        entries = []
        for name, t in inputs:
            region = f"tileship_bench_{tag}_{name}"
            flavour.fill(regions.add(region, nbytes(t)), t)
            entries.append({"name": name, "shape": list(t.shape),
                            "datatype": KSERVE[str(t.dtype).removeprefix("torch.")],
                            "parameters": {"shared_memory_region": region, "shared_memory_byte_size": nbytes(t)}})
        out_region = f"tileship_bench_{tag}_{out_name}"
        out_handle = regions.add(out_region, nbytes(ref))
        flavour.fill(out_handle, ref.new_zeros(ref.shape))
        out_params = {"shared_memory_region": out_region, "shared_memory_byte_size": nbytes(ref)}
        body = json.dumps({"inputs": entries, "outputs": [{"name": out_name, "parameters": out_params}]}).encode()

        def check(status: int, hdrs: dict[str, str], data: bytes) -> dict[str, Any]:
            if status != 200:
                raise RuntimeError(f"the first request answered {status}: {data[:500]!r}")
            out = json.loads(data)["outputs"][0]
            got = flavour.read(out_handle, ref)
            diff = float((got.double() - ref.double()).abs().max())
            named = {k: out.get("parameters", {}).get(k) for k in out_params} == out_params and "data" not in out
            return {"max_abs_diff": diff, "tolerance": tolerance(ref), "response_names_the_region": named,
                    "passed": diff <= tolerance(ref) and named}

        checked, seq = asyncio.run(check_and_time(port, f"/v2/models/{op}/infer", body,
                                                  {"Content-Type": "application/json"}, n, check))
    return {"request_bytes": len(body), "region_bytes": sum(nbytes(t) for _, t in inputs) + nbytes(ref),
            "check": checked, **seq, "cleanup_errors": regions.cleanup_errors}


def run_mode(mode: str, url: str, port: int, release: Any, op: str, request: tuple[bytes, dict[str, str], list[Any]],
             ref: Any, n: int, device_id: int) -> dict[str, Any]:
    """One mode's record: its numbers and check, ``{"skipped": reason}`` for cuda_shm without a GPU or
    cuda-python, or ``{"error": message}`` when it failed. ``passed`` is True only for a mode that ran
    with every request answered 200, its check passed and its regions released."""
    body, headers, tensors = request
    try:
        if mode == "binary":
            r = binary_mode(port, op, body, headers, ref, n)
        else:
            try:
                flavour = SystemShm() if mode == "system_shm" else CudaShm(device_id)
            except RuntimeError as exc:
                if mode == "cuda_shm":
                    return {"skipped": str(exc)}
                raise
            names = [name for name, _ in release.ops[op].shape.inputs]
            out_name = release.declarations[op]["outputs"][0][0]
            r = shm_mode(flavour, url, port, op, list(zip(names, tensors, strict=True)), out_name, ref, n)
    except Exception as exc:  # noqa: BLE001 (a failed mode is recorded; the others still run)
        return {"error": f"{type(exc).__name__}: {exc}", "passed": False}
    r["passed"] = bool(r["check"]["passed"] and r["errors"] == 0 and not r.get("cleanup_errors"))
    return r


def server_spans(log_path: Path) -> dict[str, dict[str, float]]:
    """Medians of the server's own ``infer`` lines (ms, ``spans`` included), per transport (the
    line's ``shm``: the kinds of shared-memory region the request used; none: binary)."""
    groups: dict[str, list[dict[str, float]]] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            x = json.loads(line)
        except ValueError:
            continue
        if x.get("event") != "infer" or not x.get("spans"):
            continue
        kind = {"cuda": "cuda_shm", "system": "system_shm", None: "binary"}.get(x.get("shm"), str(x.get("shm")))
        groups.setdefault(kind, []).append({"ms": x["ms"], "body_ms": x["body_ms"], "run_ms": x["run_ms"],
                                            **x["spans"]})
    return {kind: {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0]} | {"n": len(rows)}
            for kind, rows in groups.items()}


def leftover_regions(url: str, modes: list[str]) -> dict[str, Any]:
    """For each shared-memory mode of ``modes``: the regions the server still lists (its status
    route; [] when every region was unregistered), or the error string when the status request failed."""
    out: dict[str, Any] = {}
    for mode in modes:
        prefix = SystemShm.prefix if mode == "system_shm" else CudaShm.prefix
        try:
            with urllib.request.urlopen(f"{url}{prefix}/status", timeout=30) as r:
                out[mode] = json.loads(r.read())
        except (OSError, ValueError) as exc:
            out[mode] = f"status failed: {exc}"
    return out


# -- ratios and report -------------------------------------------------------------------------------

def ratio(num: float | None, den: float | None, what: str, target: float | None) -> dict[str, Any]:
    """``num / den`` with its meaning, direction and target (None when either side is missing)."""
    value = round(num / den, 3) if num and den else None
    return {"value": value, "what": what, "direction": "lower is better", "numerator_us": num,
            "denominator_us": den, "target": f"<= {target}" if target is not None else None,
            "met": (value <= target) if value is not None and target is not None else None}


def ratios(inproc: dict[str, Any], modes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    def p50(mode: str) -> float | None:
        return modes.get(mode, {}).get("p50_us")

    call, full = inproc["call"]["p50_us"], inproc["full"]["p50_us"]
    return {
        "binary_p50_over_full_p50": ratio(p50("binary"), full, "binary HTTP p50 / in-process full p50", 1.3),
        "cuda_shm_p50_over_1.1_call_p50_plus_1ms": ratio(
            p50("cuda_shm"), round(1.1 * call + 1000.0, 1), "cuda_shm HTTP p50 / (1.1 * in-process call p50 + 1 ms)",
            1.0),
        "system_shm_p50_over_full_p50": ratio(p50("system_shm"), full, "system_shm HTTP p50 / in-process full p50",
                                              None),
    }


def report(r: dict[str, Any]) -> None:
    """Print the summary: the setup, the in-process numbers, one line per mode, the ratios."""
    c, ip = r["config"], r["in_process"]
    print(f"serve_shm: {c['op']} {c['dims']} {c['dtype']} on {r['environment']['device']} "
          f"({r['environment']['gpu'] or 'no GPU'}); release {r['release_id']}; binary request "
          f"{c['binary_request_bytes']} B")
    print(f"  in-process call       p50 {ip['call']['p50_us']:>10.1f} us  p99 {ip['call']['p99_us']:>10.1f} us  "
          f"({ip['decision']})")
    print(f"  in-process full       p50 {ip['full']['p50_us']:>10.1f} us  p99 {ip['full']['p99_us']:>10.1f} us  "
          "(parse + to device + call + sync + copy back + encode)")
    for mode, m in r["modes"].items():
        if "skipped" in m:
            print(f"  HTTP {mode:<16} skipped: {m['skipped']}")
        elif "error" in m:
            print(f"  HTTP {mode:<16} FAILED: {m['error']}")
        else:
            ck = m["check"]
            print(f"  HTTP {mode:<16} p50 {m['p50_us']:>10.1f} us  p99 {m['p99_us']:>10.1f} us  mean "
                  f"{m['mean_us']:>10.1f} us  n {m['n']}  errors {m['errors']}  request {m['request_bytes']} B  "
                  f"check max|diff| {ck['max_abs_diff']:.3g} <= {ck['tolerance']:.3g}: "
                  f"{'passed' if m['passed'] else 'FAILED'}")
    for q in r["ratios"].values():
        met = {True: "met", False: "missed", None: "not measured"}[q["met"]]
        target = f"target {q['target']}: {met}" if q["target"] else "no target"
        value = f"{q['value']:.3f}" if q["value"] is not None else "n/a"
        print(f"  ratio {q['what']} = {value} ({q['direction']}; {target})")
    for kind, med in r.get("server_spans_ms", {}).items():
        print(f"  server side {kind:<11} medians (ms): " + ", ".join(f"{k} {v}" for k, v in med.items()))
    print(f"  compile attempts {r['compile_attempts']}; regions left on the server {r['regions_left_on_server']}; "
          f"ok: {r['ok']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--release", type=Path, help="release directory (default: build the CPU catalog into a temp dir)")
    ap.add_argument("--op", help=f"default: {GPU_DEFAULT[0]} with a GPU, {CPU_DEFAULT[0]} without")
    ap.add_argument("--dims", help=f"comma-separated dim=size; default: {GPU_DEFAULT[1]} with a GPU, "
                                   f"{CPU_DEFAULT[1]} without")
    ap.add_argument("--dtype", help=f"default: {GPU_DEFAULT[2]} with a GPU, {CPU_DEFAULT[2]} without")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--seq", type=int, default=100, help="timed sequential HTTP requests per mode and in-process calls")
    ap.add_argument("--max-body-mib", type=float, default=256.0, help="the server's request body limit (binary mode)")
    ap.add_argument("--threads", type=int, default=1, help="server worker threads")
    ap.add_argument("--device-id", type=int, default=0, help="the GPU of the CUDA shared-memory regions")
    ap.add_argument("--allow-unverified", action="store_true", help="run GPU kernels without verification evidence")
    ap.add_argument("--check-finite", action=argparse.BooleanOptionalAction, default=True,
                    help="the NaN/Inf output check, on both sides alike: the server (its default: on) and the "
                         "in-process runner (the library's default: off)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}")
    sys.path.insert(0, str(ROOT / "src"))
    os.environ.setdefault("TILELANG_CACHE_DIR", tempfile.mkdtemp(prefix="serve-shm-tl-"))

    import torch

    default = GPU_DEFAULT if torch.cuda.is_available() else CPU_DEFAULT
    a.op, a.dims, a.dtype = a.op or default[0], a.dims or default[1], a.dtype or default[2]
    dims = {k: int(v) for k, v in (p.split("=") for p in a.dims.split(","))}

    release_dir = a.release or build_cpu_release(Path(tempfile.mkdtemp(prefix="serve-shm-rel-")))
    port = free_port()
    url = f"http://{HOST}:{port}"
    args = ["--max-body-mib", str(a.max_body_mib), "--threads", str(a.threads)]
    if a.allow_unverified:
        args.append("--allow-unverified")
    if not a.check_finite:
        args.append("--no-check-finite")
    t_start = time.perf_counter()
    proc, log_path = start_server(release_dir, port, args, "serve-shm-log-")
    try:
        ready, ready_s, release, device = ready_release(url, proc, t_start, release_dir, a.op, a.allow_unverified)
        release.ops[a.op].check_finite = a.check_finite  # the same work per call as the server's
        request = make_request(release, a.op, dims, a.dtype, True)
        inproc = in_process(release, a.op, request[0], request[1], request[2], device, a.seq)
        ref = inproc.pop("output")
        results = {m: run_mode(m, url, port, release, a.op, request, ref, a.seq, a.device_id) for m in modes}
        leftover = leftover_regions(url, [m for m in modes if m != "binary" and "skipped" not in results[m]])
        metrics = scrape(url)
    finally:
        stop_server(proc)
    compiles = _metric(metrics, "tileship_serve_compile_attempts")
    result = {
        "benchmark": "serve_shm",
        "config": {"op": a.op, "dims": dims, "dtype": a.dtype, "modes": modes, "seq": a.seq, "warm": WARM,
                   "server_threads": a.threads, "max_body_mib": a.max_body_mib, "device_id": a.device_id,
                   "check_finite": a.check_finite,
                   "binary_request_bytes": len(request[0]), "response_bytes": inproc["response_bytes"],
                   "output": {"shape": list(ref.shape), "dtype": str(ref.dtype).removeprefix("torch.")}},
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
                        "device": device, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                        "platform": platform.platform(), "tritonclient": _version("tritonclient"),
                        "cuda_python": _version("cuda-python"), "load_average_1m": round(os.getloadavg()[0], 2),
                        "argv": sys.argv, "command": shlex.join([sys.executable, *sys.argv])},
        "release_id": release.release_id,
        "release_dir": str(release_dir),
        "server_ready_s": round(ready_s, 2),
        "ready": {k: ready.get(k) for k in ("ready", "reason", "device")},
        "in_process": inproc,
        "modes": results,
        "ratios": ratios(inproc, results),
        "compile_attempts": compiles,
        "regions_left_on_server": leftover,
        "server_log": str(log_path),
        "server_spans_ms": server_spans(log_path),
    }
    ran = [m for m in results.values() if "skipped" not in m]
    result["ok"] = compiles == 0 and not any(leftover.values()) and all(m.get("passed") for m in ran)
    report(result)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0 if result["ok"] else 1


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
