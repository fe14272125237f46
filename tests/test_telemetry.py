"""Shape telemetry: reference calls by (dtypes, shapes, reason) with their time, bounded, as JSON
(``release.telemetry()``, ``GET /v2/tileship/telemetry``) and as Prometheus series."""

from __future__ import annotations

import io

import httpx
import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tests.test_serve import serving

import tileship
import tileship.runtime.dispatch as dispatch
from tileship.runtime.telemetry import ShapeTable
from tileship.serve import ServeConfig
from tileship.serve.telemetry import ReferenceCollector
from tileship.serve.telemetry import series as prom_series


def _rows(tele: dict, op: str) -> dict[tuple[str, tuple[tuple[int, ...], ...]], dict]:
    return {(r["reason"], tuple(tuple(s) for s in r["shapes"])): r for r in tele["ops"][op]["rows"]}


@pytest.fixture
def release(cpu_release_build):
    return tileship.load(cpu_release_build.path)


def test_reference_calls_are_rows_by_shape_and_reason_kernel_calls_are_counted(release):
    norm, add = release.op("rmsnorm_cpu"), release.op("add")
    for m in (1, 7, 4096):  # declared: the T.dynamic M range at N=1024
        assert norm.call(torch.randn(m, 1024), torch.randn(1024))[1].path == "kernel"
    assert norm.call(torch.randn(64, 256), torch.randn(256))[1].path == "kernel"  # the static shape
    for _ in range(3):
        assert norm.call(torch.randn(3, 100), torch.randn(100))[1].reason == "undeclared_shape"
    norm(torch.randn(5, 100), torch.randn(100))  # __call__'s memoized path records too
    norm(torch.randn(5, 100), torch.randn(100))
    add(torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64))
    x = torch.randn(64)[::2]
    assert add.call(x, x)[1].reason == "non_contiguous"

    tele = release.telemetry()
    assert tele["schema"] == 1 and tele["release_id"] == release.release_id and tele["since"].endswith("+00:00")
    rows = _rows(tele, "rmsnorm_cpu")
    assert set(rows) == {("undeclared_shape", ((3, 100), (100,))), ("undeclared_shape", ((5, 100), (100,)))}
    r3 = rows[("undeclared_shape", ((3, 100), (100,)))]
    assert (r3["calls"], r3["dims"], r3["dtype"], r3["dtypes"]) == (3, {"M": 3, "N": 100}, "float32",
                                                                    ["float32", "float32"])
    assert r3["seconds"] > 0
    assert rows[("undeclared_shape", ((5, 100), (100,)))]["calls"] == 2
    # most first
    assert tele["ops"]["rmsnorm_cpu"]["rows"][0] is not None and tele["ops"]["rmsnorm_cpu"]["rows"][0]["calls"] == 3
    assert tele["ops"]["rmsnorm_cpu"]["kernel_calls"] == 4
    assert tele["ops"]["rmsnorm_cpu"]["other"] == {"calls": 0, "seconds": 0.0, "reasons": {}}
    add_rows = _rows(tele, "add")
    assert add_rows[("undeclared_dtype", ((16,), (16,)))]["dtype"] == "float64"
    assert add_rows[("non_contiguous", ((32,), (32,)))]["dims"] == {"N": 32}
    assert tele["ops"]["add"]["kernel_calls"] == 0
    # the per-reason counters the server's fallbacks come from agree with the rows
    assert release.counters()["rmsnorm_cpu"] == {"kernel:kernel": 4, "reference:undeclared_shape": 5}


def test_rows_are_bounded_and_the_rest_is_counted_as_other(release):
    norm = release.op("rmsnorm_cpu")
    norm.telemetry = ShapeTable(limit=4)
    for n in range(10, 16):  # six undeclared shapes, two calls each
        for _ in range(2):
            norm(torch.randn(2, n), torch.randn(n))
    t = release.telemetry()["ops"]["rmsnorm_cpu"]
    assert len(t["rows"]) == 4 and all(r["calls"] == 2 for r in t["rows"])
    assert t["other"]["calls"] == 4 and t["other"]["reasons"]["undeclared_shape"]["calls"] == 4
    assert t["other"]["seconds"] > 0


def test_keys_past_the_memo_limit_are_still_counted(release, monkeypatch):
    monkeypatch.setattr(dispatch, "MEMO_LIMIT", 0)
    norm = release.op("rmsnorm_cpu")
    for _ in range(3):
        norm(torch.randn(2, 9), torch.randn(9))
    assert not norm._memo
    (row,) = release.telemetry()["ops"]["rmsnorm_cpu"]["rows"]
    assert (row["calls"], row["dims"]) == (3, {"M": 2, "N": 9})


def _families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_prometheus_series_are_the_top_shapes_plus_other(release):
    norm = release.op("rmsnorm_cpu")
    for n, calls in ((10, 5), (11, 4), (12, 3), (13, 1)):
        for _ in range(calls):
            norm(torch.randn(2, n), torch.randn(n))
    reg = CollectorRegistry()
    reg.register(ReferenceCollector(lambda: release, top=2))
    fams = _families(generate_latest(reg).decode())
    samples = {(s.labels["operator"], s.labels["dtype"], s.labels["shape"], s.labels["reason"]): s.value
               for s in fams["tileship_reference_calls"] if s.name == "tileship_reference_calls_total"}
    assert samples == {("rmsnorm_cpu", "float32", "2x10,10", "undeclared_shape"): 5,
                       ("rmsnorm_cpu", "float32", "2x11,11", "undeclared_shape"): 4,
                       ("rmsnorm_cpu", "other", "other", "undeclared_shape"): 4}
    secs = [s for s in fams["tileship_reference_seconds"] if s.name == "tileship_reference_seconds_total"]
    assert len(secs) == 3 and all(s.value > 0 for s in secs)
    assert prom_series(release, top=20)[("rmsnorm_cpu", "float32", "2x13,13", "undeclared_shape")][0] == 1


def test_server_serves_telemetry_json_and_metrics(cpu_release_build, tmp_path):
    cfg = ServeConfig(source=cpu_release_build.path, diagnostics_dir=tmp_path / "diag", log_stream=io.StringIO())
    with serving(cfg) as srv:
        body = {"inputs": [{"name": "X", "shape": [3, 100], "datatype": "FP32", "data": [1.0] * 300},
                           {"name": "W", "shape": [100], "datatype": "FP32", "data": [1.0] * 100}]}
        declared = {"inputs": [{"name": "X", "shape": [2, 1024], "datatype": "FP32", "data": [1.0] * 2048},
                               {"name": "W", "shape": [1024], "datatype": "FP32", "data": [1.0] * 1024}]}
        for b, path in ((body, "reference"), (body, "reference"), (declared, "kernel")):
            r = httpx.post(srv.url + "/v2/models/rmsnorm_cpu/infer", json=b, timeout=30)
            assert r.status_code == 200 and r.json()["parameters"]["tileship_path"] == path, r.text
        tele = httpx.get(srv.url + "/v2/tileship/telemetry", timeout=30).json()
        assert tele["release_id"] == cpu_release_build.release_id
        row = _rows(tele, "rmsnorm_cpu")[("undeclared_shape", ((3, 100), (100,)))]
        assert (row["calls"], row["dims"]) == (2, {"M": 3, "N": 100})
        assert tele["ops"]["rmsnorm_cpu"]["kernel_calls"] >= 1
        text = httpx.get(srv.url + "/metrics", timeout=30).text
        calls = {tuple(sorted(s.labels.items())): s.value for s in _families(text)["tileship_reference_calls"]}
        key = (("dtype", "float32"), ("operator", "rmsnorm_cpu"), ("reason", "undeclared_shape"),
               ("shape", "3x100,100"))
        assert calls[key] == 2


def test_counts_are_exact_across_threads(release):
    import threading

    norm = release.op("rmsnorm_cpu")
    x, w = torch.randn(2, 33), torch.randn(33)

    def worker() -> None:
        for _ in range(200):
            norm(x, w)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (row,) = release.telemetry()["ops"]["rmsnorm_cpu"]["rows"]
    assert row["calls"] == 1600 and release.counters()["rmsnorm_cpu"] == {"reference:undeclared_shape": 1600}
