"""Warm-up (issue 16): specializations warmed on several threads give what one thread gives (the
same calls, the same failures switched to the reference), every specialization is timed, and the
live release's times are Prometheus metrics. CPU "c" releases, the real loader."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from test_serve import metric, serving

from tileship.runtime.loader import load
from tileship.serve import ServeConfig
from tileship.serve.holder import serving_devices
from tileship.serve.warmup import warm_up


def _kernel_ids(release: Any) -> set[str]:
    return {e.spec.id for r in release.ops.values() for e in r.entries if e.kernel is not None and e.spec is not None}


@pytest.mark.parametrize("threads", [1, 4])
def test_every_specialization_is_warmed_and_timed(cpu_release_build, threads):
    release = load(cpu_release_build.path)
    devices, _ = serving_devices(release)
    report = warm_up(release, devices, threads=threads)
    kernels = _kernel_ids(release)
    assert report.failures == {} and report.threads == threads
    assert kernels <= set(report.spec_seconds) and report.calls == len(report.spec_seconds)
    assert all(s > 0 for s in report.spec_seconds.values())
    assert report.seconds >= max(report.spec_seconds.values())


def test_on_threads_a_bad_kernel_is_still_switched_to_the_reference(cpu_release_build):
    release = load(cpu_release_build.path)
    devices, _ = serving_devices(release)
    bad = [e for e in release.ops["add"].entries if e.kernel is not None][:2]
    for e in bad:
        e.kernel = lambda x, y: torch.full_like(x, float("nan"))
    report = warm_up(release, devices, threads=4)
    assert set(report.failures) == {e.spec.id for e in bad}
    assert all("non-finite" in why for why in report.failures.values())
    assert all(e.kernel is None or e.decision.reason == "load_failed" for e in bad)
    assert all(e.decision.path == "reference" for e in bad)


def test_the_live_release_warm_up_is_in_the_metrics_and_the_log(cpu_release_build, tmp_path: Path):
    from test_serve import log_lines

    logs = io.StringIO()
    cfg = ServeConfig(source=cpu_release_build.path, diagnostics_dir=tmp_path / "d", log_stream=logs,
                      warmup_threads=3)
    with serving(cfg) as srv:
        text = httpx.get(srv.url + "/metrics").text
        kernels = _kernel_ids(srv.service.holder.current.release)
        for sid in kernels:
            assert metric(text, "tileship_warmup_spec_seconds", spec=sid) > 0
        ready = next(e for e in log_lines(logs) if e["event"] == "ready")
        assert ready["warmup_threads"] == 3 and len(ready["warmup_slowest"]) == 3
        refs = {f"{n}:reference" for n in srv.service.holder.current.release.ops}
        assert set(ready["warmup_slowest"]) <= kernels | refs


@pytest.mark.parametrize("answer", ["float64", "short", "numpy"])
def test_a_reference_that_breaks_its_declaration_is_blamed_not_the_kernel(cpu_release_build, answer):
    """Warm-up holds the reference's answer to the declaration (the dispatcher's check): a wrong dtype, a row short or
    a NumPy array is a ``reference:`` failure naming the output, and the kernel it was compared with keeps serving
    (before: the kernel was switched off as ``load_failed`` and the bad reference served every call)."""
    release = load(cpu_release_build.path)
    devices, _ = serving_devices(release)
    runner = release.ops["add"]
    kernels = [e for e in runner.entries if e.kernel is not None]
    wrong = {"float64": lambda x, y: (x + y).double(), "short": lambda x, y: (x + y)[:-1],
             "numpy": lambda x, y: (x + y).numpy()}[answer]
    runner.reference = wrong
    report = warm_up(release, devices)
    ids = {e.spec.id for e in kernels}
    assert ids and ids <= set(report.failures)
    assert all(report.failures[i].startswith("reference: warm-up call at ") and "add.reference" in report.failures[i]
               for i in ids), report.failures
    assert all(e.kernel is not None and e.decision.reason != "load_failed" for e in kernels)
