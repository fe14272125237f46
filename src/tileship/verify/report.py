"""An HTML page (and PNG plots) of a release's verification evidence, for a reviewer.

Per operator: speedup of the kernel over the reference by shape (whiskers: the noise band),
error by shape as the worst element's share of the tolerance (kernel and, for scale, the
reference's own in its dtype; drawn by ``report_plots``), and a table of the path each shape takes under each
routing policy and why. On top: the device fingerprint, the lock summary and what was skipped.
The page is static (no script), its images beside it; nothing here reads the GPU.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tileship.declare.spec import Specialization, Target
from tileship.errors import VerificationError
from tileship.release import described
from tileship.release import evidence as ev_mod
from tileship.verify.report_plots import plot_error, plot_speedup


def _dims(d: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in d.items())


def rows_for(spec: Specialization, entry: Mapping[str, Any] | None, *, skipped: str | None) -> list[dict[str, Any]]:
    """One row per verified shape of ``spec`` with the path each policy takes there and why."""
    label = f"{spec.dtype} {spec.shape_key}"
    if entry is None:
        path = "kernel" if Target(spec.target).device_type == "cpu" else "reference"
        tail = "; CPU kernels run unverified" if path == "kernel" else "; allow_unverified runs the kernel"
        why = f"unverified ({skipped or 'no evidence'})" + tail
        return [{"spec_id": spec.id, "label": label, "dims": spec.shape_key, "passed": None, "failure": None,
                 "timing": None, "pinned": (path, why), "evidence": (path, why), "point": {}}]
    out = []
    no_points: list[dict[str, Any]] = [{"dims": {}, "passed": False, "failure": entry.get("failure"), "timing": None}]
    for p in entry.get("points", []) or no_points:
        if not entry.get("passed"):
            failed = ("reference", f"verification_failed: {entry.get('failure')}")
            pinned = evidence = failed
        else:
            pinned = (entry.get("route", "reference"), entry.get("route_reason", ""))
            evidence = ev_mod.choice_at(entry, p.get("dims", {}))
        dims = p.get("dims", {})
        dyn = spec.dynamic_dim
        short = f"{dyn}={dims[dyn]}" if dyn in dims else _dims(dims)
        out.append({"spec_id": spec.id, "label": label, "dims": _dims(dims), "short": short, "passed": p.get("passed"),
                    "failure": p.get("failure"), "timing": p.get("timing"), "pinned": pinned, "evidence": evidence,
                    "point": p})
    return out


_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 24px; color: #222;
       max-width: 1500px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
td, th { border: 1px solid #ddd; padding: 3px 6px; text-align: left; }
th { background: #f4f4f4; } .num { text-align: right; font-variant-numeric: tabular-nums; }
.kernel { background: #e3f4ef; } .reference { background: #fbe9dc; } .fail { background: #f7d4d8; }
.banner { padding: 8px 12px; border-radius: 4px; margin: 8px 0; }
.warn { background: #fff3cd; } .bad { background: #f7d4d8; } .good { background: #e3f4ef; }
.side { display: flex; gap: 32px; flex-wrap: wrap; } img { max-width: 100%; display: block; margin: 8px 0; }
.muted { color: #666; font-size: 12px; }
"""


def _kv_table(title: str, items: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape('-' if v is None else str(v))}</td></tr>"
                   for k, v in items)
    return f"<div><h3>{html.escape(title)}</h3><table>{body}</table></div>"


def _us(v: Any) -> str:
    return "-" if v is None else f"{v:,.1f}"


def write_report(path: Path | str, out: Path | str | None = None) -> Path:
    """Write ``index.html`` and the PNGs into ``out``; return the page's path. Staged beside ``out`` and put in
    place whole (``swap.staged``): killed at any instant, ``out`` holds the old report or the new one. Raises
    VerificationError when ``out`` lies inside the release (it would break the release's integrity) or
    matplotlib is missing, BundleIntegrityError for a release that is not intact."""
    import importlib.util

    from tileship.release import bundle, swap

    if importlib.util.find_spec("matplotlib") is None:
        raise VerificationError("the report needs matplotlib, which is not installed",
                                hint="pip install 'matplotlib==3.11.2'")
    root = Path(path)
    manifest = bundle.check_integrity(root)
    rid = manifest["release_id"]
    dest = Path(out) if out is not None else Path.cwd() / f"tileship-report-{rid}"
    if dest.resolve() == root.resolve() or root.resolve() in dest.resolve().parents:
        raise VerificationError(f"{dest}: the report cannot go inside the release (extra files break its integrity)",
                                hint="pass --out elsewhere")
    with swap.staged(dest, lambda name: name == "index.html" or name.endswith(".png"), last="index.html") as tmp:
        _render(root, rid, tmp)  # killed at any instant: the old report or the new one, never half of one
    return dest / "index.html"


def _render(root: Path, rid: str, dest: Path) -> None:
    from tileship.build.lock import lock_digest, read_lock
    from tileship.verify import report_roofline
    rel = described.read(root / "release.json")
    lock = read_lock(root / "tileship.lock")
    ev = ev_mod.read(root)
    policy = rel.get("policy", {}).get("routing", "pinned")
    digest = lock_digest(lock)
    specs = {sid: Specialization.from_json(info["spec"]) for sid, info in sorted(rel["specializations"].items())}
    ev_specs = (ev or {}).get("specializations", {})
    skipped = dict((ev or {}).get("skipped", {}))
    for sid, info in rel["specializations"].items():
        if info.get("status") != "built":
            skipped[sid] = "build failed"

    parts = [f"<h1>tileship verification report: release {html.escape(rid)}</h1>",
             f"<p class='muted'>model {html.escape(str(rel['model'].get('name')))} "
             f"v{html.escape(str(rel['model'].get('version')))}, "
             f"kernel revision {html.escape(str(rel.get('kernel_revision')))}, "
             f"routing policy <b>{html.escape(policy)}</b>"
             + (f", evidence taken {html.escape(str(ev.get('created')))}" if ev else "") + "</p>"]
    if ev is None:
        parts.append("<div class='banner warn'>This release has no verification evidence: on a GPU it serves the "
                     "PyTorch reference unless unverified kernels are allowed. Run <code>tileship verify</code> on the "
                     "serving GPU.</div>")
    else:
        failed = sorted(s for s, e in ev_specs.items() if not e.get("passed"))
        stale = ev.get("lock_digest") != digest or ev.get("release_id") not in (None, rid)
        if stale:
            parts.append("<div class='banner bad'>The evidence was taken against another lock or release: "
                         "loading ignores it.</div>")
        if failed:
            parts.append(f"<div class='banner bad'>{len(failed)} specialization(s) failed verification and serve the "
                         f"reference: {html.escape(', '.join(failed))}</div>")
        else:
            parts.append(f"<div class='banner good'>All {len(ev_specs)} verified specializations passed.</div>")
    dev = (ev or {}).get("device") or {}
    host = (ev or {}).get("host") or {}
    opts = (ev or {}).get("options") or {}
    fw, be = lock.get("framework", {}), lock.get("backend", {})
    device_table = _kv_table("Device fingerprint", [
        ("GPU", dev.get("name", "none")), ("compute capability", dev.get("compute_capability")),
        ("SMs", dev.get("sm_count")), ("memory MiB", dev.get("memory_mib")), ("driver", dev.get("driver")),
        ("CUDA runtime", dev.get("cuda_runtime")), ("torch", dev.get("torch") or host.get("torch")),
        ("CPU", host.get("cpu_model")), ("CPU cores", host.get("cpu_count"))])
    lock_table = _kv_table("Lock", [
        ("digest", digest), ("evidence lock digest", (ev or {}).get("lock_digest")),
        ("tilelang", be.get("tilelang")), ("apache-tvm-ffi", be.get("apache_tvm_ffi")), ("nvcc", be.get("nvcc")),
        ("platform", be.get("platform")), ("python", fw.get("python")), ("torch (build)", fw.get("torch")),
        ("targets", ", ".join(lock.get("device_arch", {}).get("targets", []))), ("image", lock.get("image_digest"))])
    timing = (f"warm-up {opts.get('warmup_ms')} ms, {opts.get('budget_ms')} ms x 2 per path, median"
              if opts.get("timing") else "off")
    method_table = _kv_table("Method", [
        ("seeds", opts.get("seeds")), ("reference precision", opts.get("reference_dtype")),
        ("outputs", "NaN-poisoned before each run" + ("" if opts.get("strict_poison", True) else " (not strict)")),
        ("timing", timing),
        ("noise band", f"repeat difference, at least {opts.get('noise_floor', 0) * 100:g}% of the faster"),
        ("tolerance overrides", json.dumps(opts.get("tolerance_overrides") or {}))])
    parts.append("<div class='side'>" + device_table + lock_table + method_table + "</div>")
    if skipped:
        not_verified = "; ".join(f"{s} ({w})" for s, w in sorted(skipped.items()))
        parts.append("<p class='muted'>Not verified: " + html.escape(not_verified) + "</p>")

    by_op: dict[str, list[dict[str, Any]]] = {}
    for sid, spec in specs.items():
        by_op.setdefault(spec.op, []).extend(rows_for(spec, ev_specs.get(sid), skipped=skipped.get(sid)))
    for op, rows in sorted(by_op.items()):
        parts.append(f"<h2 id='{html.escape(op)}'>{html.escape(op)}</h2>")
        if op in rel.get("operators", {}):
            parts.append(f"<p class='muted'>{html.escape(signature(rel['operators'][op]))}</p>")
        if any(r["timing"] for r in rows):
            plot_speedup(rows, dest / f"{op}-speedup.png", policy=policy,
                         title=f"{op}: speedup of the kernel over the reference, by shape")
            parts.append(f"<img src='{html.escape(op)}-speedup.png' alt='{html.escape(op)} speedup by shape'>")
        elif any(r["passed"] is not None for r in rows):
            parts.append("<p class='muted'>Not timed (verified with --no-timing, or every shape failed first).</p>")
        if any(r["passed"] is not None for r in rows):
            plot_error(rows, dest / f"{op}-error.png", title=f"{op}: error by shape (share of the tolerance)")
            parts.append(f"<img src='{html.escape(op)}-error.png' alt='{html.escape(op)} error by shape'>")
        entries = [(sid, ev_specs[sid]) for sid, spec in specs.items() if spec.op == op and sid in ev_specs]
        parts.append(report_roofline.section(op, entries, (ev or {}).get("ceilings"), dest))
        parts.append(_op_table(rows, policy))
    parts.append("<p class='muted'>Speedup = reference median / kernel median per call, as served (the kernel "
                 "allocates its output). Whiskers span the noise band (the difference between two repeats of the same "
                 "measurement); a difference inside it is no difference and keeps the kernel. Error = the worst "
                 "element's |out - ref| / (atol + rtol |ref|) against a float64 reference: at most 1 passes; NaN/Inf "
                 "and unwritten (still poisoned) elements never pass. <i>pinned</i> serves the kernel only where it "
                 "was never measurably slower; <i>evidence</i> picks per shape.</p>")
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>tileship report {html.escape(rid)}</title>"
            f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>\n")
    (dest / "index.html").write_text(page)


def signature(desc: Mapping[str, Any]) -> str:
    """``A: same (N), Q: int32 (N/8) -> C: same (N), Z: int32 (N/8) [same = float32 | float64]``:
    each tensor with its own dtype and dims, as declared."""
    exprs = desc.get("tensor_dtypes") or {}

    def one(n: str, ds: Sequence[str]) -> str:
        return f"{n}: {exprs.get(n, 'same')} ({', '.join(ds)})"

    ins = ", ".join(one(n, ds) for n, ds, *_ in desc["inputs"])
    outs = ", ".join(one(n, ds) for n, ds, *_ in desc["outputs"])
    return f"{ins} -> {outs} [same = {' | '.join(desc.get('dtypes', []))}]"


def _op_table(rows: Sequence[Mapping[str, Any]], policy: str) -> str:
    head = ("<tr><th>specialization</th><th>shape</th><th>result</th><th>kernel us (p10-p90)</th>"
            "<th>reference us (p10-p90)</th><th>noise us</th><th>speedup</th><th>worst err/tol</th><th>rel L2 err</th>"
            f"<th>pinned{' (policy)' if policy == 'pinned' else ''}</th>"
            f"<th>evidence{' (policy)' if policy == 'evidence' else ''}</th></tr>")
    body = []
    for r in rows:
        t, p = r["timing"], r["point"]
        k = t["kernel"] if t else {}
        ref = t["reference"] if t else {}
        result = "-" if r["passed"] is None else ("passed" if r["passed"] else f"FAILED: {r['failure']}")
        cells = [r["spec_id"], r["dims"], result,
                 f"{_us(k.get('median_us'))} ({_us(k.get('p10_us'))}-{_us(k.get('p90_us'))})" if t else "-",
                 f"{_us(ref.get('median_us'))} ({_us(ref.get('p10_us'))}-{_us(ref.get('p90_us'))})" if t else "-",
                 _us(t.get("noise_us")) if t else "-", f"{t['speedup']:.2f}x" if t and t.get("speedup") else "-",
                 f"{p['tol_ratio']:.3g}" if p.get("tol_ratio") is not None else "-",
                 f"{p['rel_l2_err']:.2e}" if p.get("rel_l2_err") is not None else "-"]
        tds = "".join(f"<td class='{'num' if 3 <= i <= 8 else ''}{' fail' if i == 2 and r['passed'] is False else ''}'>"
                      f"{html.escape(c)}</td>" for i, c in enumerate(cells))
        for pol in ("pinned", "evidence"):
            path, why = r[pol]
            tds += f"<td class='{path}'><b>{html.escape(path)}</b>: {html.escape(why)}</td>"
        body.append(f"<tr>{tds}</tr>")
    return f"<table>{head}{''.join(body)}</table>"
