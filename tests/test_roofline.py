"""Roofline evidence: the ceiling math, cost models that fail, and a real verify + report on the CPU."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from tileship.catalog import costs
from tileship.release import evidence
from tileship.verify import roofline

CEILINGS = {"device": "cpu", "bytes_per_s": 1e12, "flops_per_s": {"float32": 1e13}, "method": "test"}


def test_a_memory_bound_shape_is_measured_against_bandwidth() -> None:
    rf = roofline.point_roofline(1e6, 1e6, kernel_us=2.0, reference_us=4.0, dtype="float32", ceilings=CEILINGS)
    assert rf["bound"] == "memory" and rf["ridge"] == pytest.approx(10.0) and rf["intensity"] == pytest.approx(1.0)
    assert rf["kernel"]["bytes_per_s"] == pytest.approx(5e11)
    assert rf["kernel"]["pct_of_bound"] == pytest.approx(50.0)
    assert rf["reference"]["pct_of_bound"] == pytest.approx(25.0)
    assert rf["kernel"]["pct_peak_flops"] == pytest.approx(5.0)


def test_a_compute_bound_shape_is_measured_against_flops() -> None:
    rf = roofline.point_roofline(1e9, 1e6, kernel_us=200.0, reference_us=None, dtype="bfloat16", ceilings=CEILINGS)
    assert rf["bound"] == "compute"  # 1000 FLOP/byte, ridge 10; bf16 falls back to the fastest measured dtype
    assert rf["kernel"]["pct_of_bound"] == pytest.approx(50.0)
    assert "reference" not in rf


def test_a_cost_model_that_raises_is_recorded_not_fatal() -> None:
    points = [{"dims": {"N": 4}, "timing": {"kernel": {"median_us": 1.0}, "reference": {"median_us": 1.0}}},
              {"dims": {"N": 8}, "timing": None}]

    def broken(dims, dtype):
        raise KeyError("M")

    roofline.annotate(points, broken, "float32", CEILINGS)
    assert points[0]["roofline"]["error"].startswith("cost model raised KeyError")
    assert "roofline" not in points[1]


@pytest.mark.parametrize("fn,dims,dtype,expected", [
    (costs.gemm, {"M": 2, "N": 3, "K": 4}, "float16", (48.0, (8 + 12 + 6) * 2.0)),
    (costs.w4a16_linear, {"M": 1, "N": 4096, "K": 4096}, "float16",
     (2.0 * 4096 * 4096, 4096 * 2048 + 4096 * 32 * 2 + 8192 * 2.0)),
    (costs.gqa_decode, {"B": 1, "S": 8192, "HQ": 32, "HKV": 8, "D": 128}, "float16",
     (4.0 * 32 * 8192 * 128, 2.0 * 8192 * 8 * 128 * 2 + 2 * 32 * 128 * 2 + 4)),
], ids=["gemm", "w4a16", "gqa"])
def test_cost_models(fn, dims, dtype, expected) -> None:
    assert fn(dims, dtype) == pytest.approx(expected)


def test_cpu_ceilings_are_measured() -> None:
    c = roofline.measure_ceilings("cpu")
    assert c["device"] == "cpu" and c["bytes_per_s"] > 1e8 and c["flops_per_s"]["float32"] > 1e8


@pytest.fixture(scope="module")
def verified_twins(tmp_path_factory):
    """The decode twins built for "c" and verified here with timing (their ops declare cost models)."""
    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import builtin_project, load_operators
    from tileship.verify.spec_check import VerifyOptions
    from tileship.verify.verify import verify

    project = dataclasses.replace(builtin_project(), targets=("c",), operator_modules=("tileship.catalog.cpu_decode",))
    built = build(project, load_operators(project), tmp_path_factory.mktemp("rf"), BuildOptions(jobs=2))
    dest = tmp_path_factory.mktemp("rf-verified") / built.release_id
    shutil.copytree(built.path, dest)
    result = verify(dest, VerifyOptions(seeds=(0,), budget_ms=10.0, warmup_ms=2.0, min_repeats=3, max_repeats=5))
    return dest, result


def test_verify_puts_every_timed_shape_on_the_roofline(verified_twins) -> None:
    dest, result = verified_twins
    ev = evidence.read(dest)
    cpu = ev["ceilings"]["cpu"]
    assert cpu["bytes_per_s"] > 0 and cpu["flops_per_s"]["float32"] > 0
    timed = [p for e in ev["specializations"].values() for p in e["points"] if p.get("timing")]
    assert timed, "the twins were timed"
    for p in timed:
        rf = p["roofline"]
        assert rf["bound"] in ("memory", "compute")
        assert rf["kernel"]["pct_of_bound"] > 0 and rf["reference"]["pct_of_bound"] > 0
        assert rf["flops"] > 0 and rf["bytes"] > 0


def test_report_draws_a_roofline_per_operator(verified_twins, tmp_path) -> None:
    from tileship.verify.report import write_report

    dest, _ = verified_twins
    page = write_report(dest, tmp_path / "report")
    text = page.read_text()
    for op in ("w4a16_cpu", "gqa_decode_cpu"):
        assert f"src='{op}-roofline.png'" in text and (page.parent / f"{op}-roofline.png").stat().st_size > 1000
    assert "Farthest from its bound" in text and "share of the bound" in text
