"""Rollback drill: switch a serving process N -> N-1 -> reference -> N under load, and prove
no request failed, was dropped or answered wrongly.

``run_drill(DrillOptions(registry=...))`` starts ``tileship serve REGISTRY`` as a subprocess
(or uses ``url``), keeps a bounded closed-loop load on it (``concurrency`` clients, KServe v2
binary tensors over httpx), and switches through the registry plus ``POST
/v2/repository/reload``. Every answer is compared with the operator's reference computed
locally (float64, on the GPU when there is one) within the declared tolerance. Each response
names the release and path that served it; a request sent after a switch completed must be
served by the new state (``stale`` otherwise). Writes ``drill.json``, ``drill.txt`` and ``metrics.txt``,
each replaced whole (``drill_report.write_report``).
"""

from __future__ import annotations

import importlib
import math
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tileship.errors import TileshipError
from tileship.release import described
from tileship.release.registry import Registry
from tileship.verify.drill_load import Record, Sample, encode_request, run_client
from tileship.verify.drill_report import summarize, write_report


class DrillError(TileshipError):
    """The drill could not run (server did not start, a switch was refused). Not: a failed drill, which is a report."""


@dataclass(frozen=True)
class DrillOptions:
    registry: Path
    new: str | None = None            # N: default the active release
    old: str | None = None            # N-1: default the release rollback would return to
    out_dir: Path = Path("drill-report")
    url: str | None = None            # a running server that follows ``registry``; default: start one
    port: int = 0                     # for the started server; 0: a free one
    server_args: tuple[str, ...] = ()
    phase_seconds: float = 5.0
    concurrency: int = 4
    ops: tuple[str, ...] = ()         # default: every operator both releases have
    per_op: int = 4                   # request shapes per operator
    dynamic_limit: int = 256          # largest size tried for a T.dynamic dim
    max_request_bytes: int = 48 << 20
    request_timeout_s: float = 60.0
    startup_timeout_s: float = 600.0
    seed: int = 0


@dataclass
class Window:
    name: str
    start: float
    end: float = 0.0
    expect_release: str | None = None
    expect_reference: bool = False
    switch: dict[str, Any] = field(default_factory=dict)


def run_drill(opts: DrillOptions) -> dict[str, Any]:
    """Run the drill; return the report (also written to ``opts.out_dir``). Raises DrillError
    when it cannot run at all; a drill that ran but saw failures returns ``passed: False``."""
    import httpx

    reg = Registry(opts.registry)
    start_state = reg.active()
    new = reg.resolve(opts.new) if opts.new else start_state.release_id
    old = reg.resolve(opts.old) if opts.old else start_state.previous
    if new is None or old is None or new == old:
        raise DrillError(f"the drill needs two different releases N and N-1 (got N={new}, N-1={old})",
                         hint="pass --new and --old, or activate N-1 then N so the registry's history names both")
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    samples, skipped = build_samples(reg, new, old, opts)
    if not samples:
        raise DrillError(f"no request shape of releases {new}/{old} fits --max-request-bytes {opts.max_request_bytes}",
                         hint="raise it")
    if reg.active().release_id != new or reg.active().reference_only:
        reg.activate(new)
    proc = None
    url = opts.url
    log_path = out / "server.log"
    try:
        if url is None:
            port = opts.port or _free_port()
            url = f"http://127.0.0.1:{port}"
            proc = _start_server(opts, port, log_path)
        ready_body = _wait_ready(url, proc, log_path, opts.startup_timeout_s)
        with httpx.Client(base_url=url, timeout=opts.request_timeout_s) as admin:
            if opts.url is not None:
                _reload(admin)  # an external server may lag the registry
            records: list[Record] = []
            stop = threading.Event()
            threads = [threading.Thread(target=run_client, args=(url, samples, i, stop, records, opts), daemon=True,
                                        name=f"drill-{i}")
                       for i in range(opts.concurrency)]
            windows = [Window("N", time.perf_counter(), expect_release=new)]
            for t in threads:
                t.start()
            plan = [("switch N -> N-1", "N-1", lambda: reg.activate(old), old, False),
                    ("switch N-1 -> reference", "reference", lambda: reg.activate_reference(old), old, True),
                    ("switch reference -> N", "N (restored)", lambda: reg.activate(new), new, False)]
            for switch_name, phase_name, act, rid, ref_only in plan:
                time.sleep(opts.phase_seconds)
                standby = _get_json(admin, "/v2/health/ready").get("standby")  # warm before the switch? (serve.standby)
                t_sw = time.perf_counter()
                windows[-1].end = t_sw
                sw = Window(switch_name, t_sw)
                act()
                t_reg = time.perf_counter()
                status, body = _reload(admin)
                t_done = time.perf_counter()
                sw.end = t_done
                sw.switch = {"registry_s": t_reg - t_sw, "reload_s": t_done - t_reg, "total_s": t_done - t_sw,
                             "status": status,
                             "result": body.get("result"), "to_release": rid, "reference_only": ref_only,
                             "load_seconds": body.get("load_seconds"), "warmup_seconds": body.get("warmup_seconds"),
                             "warm": body.get("warm"), "standby_before": standby, "error": body.get("error")}
                windows.append(sw)
                windows.append(Window(phase_name, t_done, expect_release=rid, expect_reference=ref_only))
            time.sleep(opts.phase_seconds)
            windows[-1].end = time.perf_counter()
            stop.set()
            for t in threads:
                t.join(opts.request_timeout_s + 5)
            metrics = _get_text(admin, "/metrics")
            index = _get_json(admin, "/v2/repository/index", post=True)
        write_report(out, metrics=metrics or "")
        report = summarize(records, windows, samples, skipped, new=new, old=old, url=url, ready=ready_body, opts=opts)
        report["repository_index"] = index
        report["compile_attempts"] = _metric_value(metrics, "tileship_serve_compile_attempts")
    finally:
        if proc is not None:
            _stop_server(proc)
        if start_state.release_id is not None:
            cur = reg.active()
            if (cur.release_id, cur.reference_only) != (start_state.release_id, start_state.reference_only):
                if start_state.reference_only:
                    reg.activate_reference(start_state.release_id)
                else:
                    reg.activate(start_state.release_id, force=True)
    write_report(out, report=report)
    return report


# -- requests ------------------------------------------------------------------------------

def build_samples(reg: Registry, new: str, old: str, opts: DrillOptions) -> tuple[list[Sample], list[str]]:
    """Pre-encoded requests with their expected answers, for operators both releases serve."""
    import torch

    from tileship.declare.inputs import make_inputs, sample_points
    from tileship.declare.spec import Specialization, tensor_dtypes
    from tileship.serve.in_place import answered_names, with_mutated
    from tileship.verify.mutated import as_list

    rel_new = described.read(reg.path_of(new) / "release.json")
    rel_old = described.read(reg.path_of(old) / "release.json")
    ops = [o for o in sorted(rel_new["operators"]) if o in rel_old["operators"] and (not opts.ops or o in opts.ops)]
    unknown = sorted(set(opts.ops) - set(ops))
    if unknown:
        common = sorted(set(rel_new["operators"]) & set(rel_old["operators"]))
        raise DrillError(f"operators {unknown} are not served by both {new} and {old} (common: {common})")
    ref_device = "cuda" if torch.cuda.is_available() else "cpu"
    samples: list[Sample] = []
    skipped: list[str] = []
    for k, name in enumerate(ops):
        desc = rel_new["operators"][name]
        if desc.get("scalars"):
            skipped.append(f"{name}: takes scalar arguments ({', '.join(desc['scalars'])}), which the drill's load "
                           "generator does not send")
            continue
        inputs = [(n, tuple(d)) for n, d, *_ in desc["inputs"]]
        sample_fn = _import(desc["sample"]) if desc.get("sample") else None
        ref_fn = _import(desc["reference"])
        specs = [Specialization.from_json(i["spec"]) for _, i in sorted(rel_new["specializations"].items())
                 if i["spec"]["op"] == name]
        candidates = []
        for spec in specs:
            for dims in sample_points(spec, limit=opts.dynamic_limit):
                nbytes = _request_bytes(inputs, dims, tensor_dtypes(desc, "inputs", spec.dtype))
                if nbytes <= opts.max_request_bytes:
                    candidates.append((nbytes, spec, dims))
                else:
                    skipped.append(f"{spec.id} at {dims}: {nbytes / 2**20:.0f} MiB request > "
                                   f"{opts.max_request_bytes / 2**20:.0f} MiB")
        candidates.sort(key=lambda c: c[0])
        chosen = _spread(candidates, opts.per_op)
        for j, (nbytes, spec, dims) in enumerate(chosen):
            args = make_inputs(inputs, dims, spec.dtype, "cpu", opts.seed + 100 * k + j,
                               dtypes=tensor_dtypes(desc, "inputs", spec.dtype), sample=sample_fn)
            # copies (``copy=True``): an in-place reference must not change the request the drill sends
            ref_args = [a.to(ref_device, torch.float64 if a.is_floating_point() else a.dtype, copy=True) for a in args]
            with torch.no_grad():
                ref = ref_fn(*ref_args)
            # what the server answers (``serve.in_place``): the declared outputs, then each input updated in place
            refs = [r.cpu() for r in with_mutated(desc, as_list(ref), ref_args)]
            names = answered_names(desc)
            tol = desc["tolerances"][spec.dtype]
            body, hl = encode_request(inputs, args, names)
            samples.append(Sample(name, spec.id, dims, spec.dtype, body, hl, names, refs,
                                  (float(tol["atol"]), float(tol["rtol"])), nbytes))
    return samples, skipped


def _spread(cands: list[Any], n: int) -> list[Any]:
    if len(cands) <= n:
        return cands
    step = (len(cands) - 1) / max(1, n - 1)
    return [cands[round(i * step)] for i in range(n)]


def _request_bytes(inputs: list[tuple[str, tuple[str, ...]]], dims: dict[str, int], dtypes: list[str]) -> int:
    from tileship.declare.inputs import shapes_of
    from tileship.serve.protocol import ITEMSIZE, KSERVE

    return sum(math.prod(s) * ITEMSIZE[KSERVE[dt]] for s, dt in zip(shapes_of(inputs, dims), dtypes, strict=True))


def _import(qualname: str) -> Any:
    module, _, attr = qualname.rpartition(".")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


# -- report ----------------------------------------------------------------------------------


# -- server process ----------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(opts: DrillOptions, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-c", "import sys; from tileship.cli import main; sys.argv[0] = 'tileship'; main()",
           "serve", str(opts.registry), "--port", str(port), *opts.server_args]
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log = open(log_path, "wb")  # noqa: SIM115 (closed with the process)
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    finally:
        log.close()


def _wait_ready(url: str, proc: subprocess.Popen[bytes] | None, log_path: Path, timeout: float) -> dict[str, Any]:
    import httpx

    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise DrillError(f"the server exited with status {proc.returncode} before it was ready; its "
                             f"log:\n{_tail(log_path)}")
        try:
            r = httpx.get(f"{url}/v2/health/ready", timeout=5)
            if r.status_code == 200:
                return dict(r.json())
            last = r.text[:300]
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.2)
    raise DrillError(f"{url} was not ready within {timeout:g} s (last: {last}); server log:\n{_tail(log_path)}")


def _stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _reload(client: Any) -> tuple[int, dict[str, Any]]:
    r = client.post("/v2/repository/reload", timeout=None)
    try:
        body = r.json()
    except ValueError:
        body = {"error": r.text[:500]}
    return r.status_code, body if isinstance(body, dict) else {"body": body}


def _get_text(client: Any, path: str) -> str | None:
    try:
        return str(client.get(path).text)
    except Exception:
        return None


def _get_json(client: Any, path: str, *, post: bool = False) -> Any:
    try:
        r = client.post(path) if post else client.get(path)
        return r.json()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _metric_value(text: str | None, name: str) -> float | None:
    for line in (text or "").splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            try:
                return float(line.rsplit(" ", 1)[1])
            except ValueError:
                return None
    return None


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"
