"""tileship verify: correctness checks (poison, NaN, tolerance), timing statistics, evidence
stored with the release, and routing by evidence (pinned vs evidence, unverified on a GPU)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tileship.declare.inputs import make_inputs, verification_points
from tileship.declare.spec import Specialization, Target, Tolerance
from tileship.errors import BundleIntegrityError
from tileship.release import evidence
from tileship.runtime import nojit
from tileship.verify.compare import check_output, fill_poison, poisoned_call
from tileship.verify.spec_check import VerifyOptions, time_pair, verify_spec
from tileship.verify.timing import CPU_CACHE_BYTES, MAX_INPUT_SETS, rotation_sets
from tileship.verify.verify import verify

TESTS = Path(__file__).parent
QUICK = VerifyOptions(seeds=(0, 1), limit=1024, grid=0, budget_ms=2.0, warmup_ms=1.0, min_repeats=3, max_repeats=5)
H200 = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "driver": "580.159.04",
        "cuda_runtime": "13.0", "torch": "2.11.0+cu130"}
H100 = {**H200, "name": "NVIDIA H100 80GB HBM3", "sm_count": 132}


# -- fixtures --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def verified_catalog(cpu_release_build, tmp_path_factory):
    """The CPU catalog release, verified once (with timing) in a module-private copy."""
    dest = tmp_path_factory.mktemp("verified") / cpu_release_build.release_id
    shutil.copytree(cpu_release_build.path, dest)
    return verify(dest, QUICK)


@pytest.fixture
def verified_copy(verified_catalog, tmp_path) -> Path:
    dest = tmp_path / verified_catalog.release_id
    shutil.copytree(verified_catalog.path, dest)
    return dest


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """The deliberately wrong kernels of tests/faulty_ops.py, built for "c" and verified."""
    from tileship.build.builder import BuildOptions, build
    from tileship.declare.project import Project, load_operators

    project = Project(model="faulty", model_version="1", operator_modules=("faulty_ops",), targets=("c",), root=TESTS)
    result = build(project, load_operators(project), tmp_path_factory.mktemp("faulty"), BuildOptions(jobs=2))
    assert result.ok, [(r.spec.id, r.error) for r in result.failed]
    return verify(result.path, VerifyOptions(seeds=(0, 1), timing=False, grid=0))


def _verdict(result, spec_id):
    return next(v for v in result.verdicts if v.spec.id == spec_id)


# -- checks of one output -----------------------------------------------------------------

def _poisoned(n, dtype=torch.float32):
    return fill_poison(torch.empty(n, dtype=dtype))


CASES = {
    "exact": (lambda r: r.clone(), None, {}),
    "within-tolerance": (lambda r: r + 5e-5, None, {}),
    "one-element-off": (lambda r: r.index_fill(0, torch.tensor([7]), 100.0), "1 of 64 elements beyond atol",
                        {"mismatches": 1}),
    "nan": (lambda r: r.index_fill(0, torch.tensor([3]), float("nan")), "1 of 64 elements are NaN/Inf",
            {"nonfinite": 1}),
    "inf": (lambda r: r.index_fill(0, torch.tensor([5]), float("inf")), "1 of 64 elements are NaN/Inf",
            {"nonfinite": 1}),
    "unwritten": (lambda r: torch.cat([r[:60], _poisoned(4)]), "4 of 64 elements never written",
                  {"unwritten": 4, "nonfinite": 0}),
    "wrong-shape": (lambda r: r[:32], "output shape (32,) != reference shape (64,)", {}),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_check_output(case):
    make, failure, counts = CASES[case]
    ref = torch.randn(64, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    c = check_output(make(ref.float()), ref, atol=1e-4, rtol=1e-4)
    if failure is None:
        assert c.passed, c.failure
        assert c.tol_ratio is not None and c.tol_ratio <= 1
    else:
        assert not c.passed and failure in c.failure, c.failure
    for k, v in counts.items():
        assert getattr(c, k) == v, (k, c)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32])
def test_poison_is_told_apart_from_computed_values(dtype):
    ref = torch.randn(16, dtype=torch.float64).round()
    out = ref.to(dtype).clone()  # .to() of the same dtype would alias ref
    out[:3] = _poisoned(3, dtype)
    if dtype.is_floating_point:
        out[3] = float("nan")  # a NaN the kernel computed is not "unwritten"
    c = check_output(out, ref, atol=0.0, rtol=0.0)
    assert c.unwritten == 3 and "3 of 16 elements never written" in c.failure
    if dtype.is_floating_point:
        assert c.nonfinite == 1


def test_poisoned_call_exposes_elements_a_kernel_skips():
    def half_kernel(a):
        out = torch.empty(a.shape, dtype=a.dtype)  # the adapter's allocation: poisoned
        out[: a.numel() // 2] = a[: a.numel() // 2]
        return out

    a = torch.randn(100)
    outs, confirmed = poisoned_call(half_kernel, [a], [((100,), torch.float32)])
    assert confirmed
    c = check_output(outs[0], a.double(), atol=0, rtol=0)
    assert c.unwritten == 50 and c.mismatches == 0
    assert torch.empty is not None and torch.empty.__name__ == "empty"  # the swap is undone


FAKE_DESC = {"inputs": [["A", ["N"]], ["B", ["N"]]], "outputs": [["C", ["N"]]], "config": {},
             "tolerances": {"float32": {"atol": 1e-4, "rtol": 1e-4}}}
FAKE_SPEC = Specialization("fake", "float32", (("N", 64),), "c")


def test_unconfirmed_poison_fails_unless_not_strict():
    # torch.add allocates in C++, outside the poisoned allocator: an unwritten element would go unseen
    strict = verify_spec(FAKE_SPEC, torch.add, torch.add, FAKE_DESC, options=VerifyOptions(seeds=(0,), timing=False))
    assert not strict.passed and "could not confirm the outputs were poisoned" in strict.failure
    lax = verify_spec(FAKE_SPEC, torch.add, torch.add, FAKE_DESC,
                      options=VerifyOptions(seeds=(0,), timing=False, strict_poison=False))
    assert lax.passed and lax.points[0].poison_confirmed is False
    assert lax.to_json()["points"][0]["poison_confirmed"] is False


def test_kernel_that_raises_fails_verification():
    def broken(a, b):
        raise RuntimeError("illegal memory access")

    v = verify_spec(FAKE_SPEC, broken, torch.add, FAKE_DESC, options=VerifyOptions(seeds=(0,), timing=False))
    assert not v.passed and "kernel raised RuntimeError: illegal memory access" in v.failure


def test_tolerance_override_replaces_the_declared_one():
    def sloppy(a, b):
        out = torch.empty(a.shape, dtype=a.dtype)
        out.copy_(a + b + 1e-3)
        return out

    declared = verify_spec(FAKE_SPEC, sloppy, torch.add, FAKE_DESC, options=VerifyOptions(seeds=(0,), timing=False))
    assert not declared.passed and "beyond atol=0.0001" in declared.failure
    loose = VerifyOptions(seeds=(0,), timing=False, tolerances={"fake": {"float32": Tolerance(1e-2, 1e-2)}})
    v = verify_spec(FAKE_SPEC, sloppy, torch.add, FAKE_DESC, options=loose)
    assert v.passed and v.to_json()["tolerance"] == {"atol": 1e-2, "rtol": 1e-2, "overridden": True}


# -- shapes, inputs, timing -------------------------------------------------------------

def test_verification_points_cover_edges_and_sizes_in_between():
    spec = Specialization("add", "float32", (("N", (1, 1 << 24)),), "c")
    sizes = [p["N"] for p in verification_points(spec, block=256, grid=4)]
    assert sizes == sorted(set(sizes))
    assert {1, 259, (1 + (1 << 24)) // 2, 1 << 24} <= set(sizes)  # 1, not a multiple of the block, middle, max
    assert {4 ** k for k in range(13)} <= set(sizes)
    assert [p["N"] for p in verification_points(spec, block=256, grid=0, limit=4096)] == [1, 259, 2048, 4096]
    fixed = Specialization("rms", "float32", (("M", (1, 4096)), ("N", 1024)), "c")
    assert all(p["N"] == 1024 and list(p) == ["M", "N"] for p in verification_points(fixed, grid=2))
    static = Specialization("add", "float32", (("N", 4096),), "c")
    assert verification_points(static) == [{"N": 4096}]


def test_inputs_are_fresh_random_never_zero():
    ins = [("A", ("M", "K")), ("B", ("K",))]
    a = make_inputs(ins, {"M": 8, "K": 16}, "float16", "cpu", seed=3)
    b = make_inputs(ins, {"M": 8, "K": 16}, "float16", "cpu", seed=3)
    c = make_inputs(ins, {"M": 8, "K": 16}, "float16", "cpu", seed=4)
    assert a[0].shape == (8, 16) and a[1].shape == (16,) and a[0].dtype == torch.float16
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])
    assert (a[0] != 0).float().mean() > 0.95


@pytest.mark.parametrize(("k", "r", "noise", "want"), [
    (10.0, 20.0, 1.0, "kernel_faster"),
    (20.0, 10.0, 1.0, "reference_faster"),
    (10.5, 10.0, 1.0, "no_difference"),
    (10.0, 10.5, 1.0, "no_difference"),
    (11.0, 10.0, 1.0, "no_difference"),  # exactly the band: no difference
])
def test_compare_times(k, r, noise, want):
    assert evidence.compare_times(k, r, noise) == want


def test_time_pair_tells_the_slower_path():
    def slow(*_):
        time.sleep(0.002)

    def fast(*_):
        return None

    opts = VerifyOptions(budget_ms=10, warmup_ms=2, min_repeats=3, max_repeats=10)
    sets = [[torch.ones(1)]]
    t = time_pair(slow, fast, sets, device="cpu", options=opts)
    assert t.verdict == "reference_faster" and t.kernel.median_us > 1500 and t.speedup < 0.1
    assert t.noise_us >= 0.01 * t.reference.median_us
    t2 = time_pair(fast, slow, sets, device="cpu", options=opts)
    assert t2.verdict == "kernel_faster"
    doc = t.to_json()
    assert set(doc["kernel"]) >= {"median_us", "p10_us", "p90_us", "iqr_us",
                                  "repeats"} and doc["kernel"]["p10_us"] <= doc["kernel"]["p90_us"]


def test_inputs_rotate_only_when_they_fit_in_the_cache():
    first = [torch.randn(256)]
    sets = rotation_sets(first, lambda i: [torch.randn(256)], device="cpu", out_bytes=1024)
    assert len(sets) == MAX_INPUT_SETS and sets[0] is first and not torch.equal(sets[1][0], first[0])
    assert len(rotation_sets(first, lambda i: [torch.randn(256)], device="cpu", out_bytes=2 * CPU_CACHE_BYTES)) == 1


# -- the deliberately wrong kernels --------------------------------------------------

def test_wrong_value_is_caught(faulty):
    v = _verdict(faulty, "wrong_add.float32.N4096.c")
    assert not v.passed
    # every 97th element is A - B: ceil(4096 / 97) = 43 of them, in every seed
    assert "43 of 4096 elements beyond atol=0.0001 + rtol=0.0001*|ref|" in v.failure
    assert all(c.mismatches == 43 and c.unwritten == 0 for _, c in v.points[0].checks)


def test_skipped_elements_are_caught_by_the_poison(faulty):
    dyn = _verdict(faulty, "tail_add.float32.N1-65536.c")
    by_n = {p.dims["N"]: p for p in dyn.points}
    assert sorted(by_n) == [1, 259, 32768, 65536]
    assert all(p.poison_confirmed for p in dyn.points)
    # the tail N % 256 is never written; sizes that are multiples of the block hide the bug
    assert [c.unwritten for _, c in by_n[259].checks] == [3, 3]
    assert [c.unwritten for _, c in by_n[1].checks] == [1, 1]
    assert by_n[32768].passed and by_n[65536].passed
    assert not dyn.passed and dyn.failure.startswith("at N=1: 1 of 1 elements never written")
    assert "never written" in by_n[259].failure
    assert _verdict(faulty, "tail_add.float32.N4096.c").passed  # static 4096 = 16 full blocks


def test_nan_output_fails(faulty):
    v = _verdict(faulty, "nan_add.float32.N4096.c")
    assert not v.passed and "elements are NaN/Inf" in v.failure
    checks = [c for _, c in v.points[0].checks]
    assert all(c.nonfinite > 0 and c.unwritten == 0 for c in checks)


def test_failed_kernels_serve_the_reference_after_verification(faulty):
    from tileship.runtime.loader import load

    rel = load(faulty.path)
    d = rel.decisions()
    assert d["wrong_add"]["wrong_add.float32.N4096.c"] == "reference:verification_failed"
    assert d["nan_add"]["nan_add.float32.N4096.c"] == "reference:verification_failed"
    assert d["tail_add"]["tail_add.float32.N1-65536.c"] == "reference:verification_failed"
    assert d["tail_add"]["tail_add.float32.N4096.c"] == "kernel:kernel"
    a, b = torch.randn(4096), torch.randn(4096)
    out, dec = rel.op("wrong_add").call(a, b)
    assert dec.reason == "verification_failed" and torch.equal(out, a + b)
    assert any(
        n.endswith(
            "1 passed, 3 failed (nan_add.float32.N4096.c, tail_add.float32.N1-65536.c, wrong_add.float32.N4096.c)"
        )
        for n in rel.status()["notes"]
    ), rel.status()["notes"]


# -- evidence stored with the release -------------------------------------------------

def test_evidence_is_stored_without_changing_the_release_id(verified_catalog, cpu_release_build):
    from tileship.build.lock import lock_digest, read_lock
    from tileship.release import bundle

    root = verified_catalog.path
    assert verified_catalog.ok, [v.failure for v in verified_catalog.failed]
    manifest = bundle.check_integrity(root)
    assert manifest["release_id"] == cpu_release_build.release_id == verified_catalog.release_id
    assert evidence.EVIDENCE in manifest["files"]
    ev = evidence.read(root)
    assert ev["lock_digest"] == lock_digest(read_lock(root / "tileship.lock"))
    assert ev["release_id"] == cpu_release_build.release_id
    assert ev["device"] is None and ev["host"]["cpu_model"] == evidence.current_host()["cpu_model"]
    add = ev["specializations"]["add.float32.N1-16777216.c"]
    assert [p["dims"]["N"] for p in add["points"]] == [1, 259, 512, 1024]  # limit=1024 caps the max
    assert add["passed"] and add["route"] in ("kernel", "reference") and add["route_reason"]
    for p in add["points"]:
        assert p["poison_confirmed"] and len(p["checks"]) == 2 and p["tol_ratio"] <= 1
        assert p["timing"]["verdict"] in ("kernel_faster", "reference_faster", "no_difference")
        assert p["timing"]["kernel"]["median_us"] > 0 and p["timing"]["noise_us"] > 0
    assert set(ev["specializations"]) == set(json.loads((root / "release.json").read_text())["specializations"])


def test_tampered_evidence_is_refused_by_load(verified_copy):
    from tileship.runtime.loader import load

    p = verified_copy / evidence.EVIDENCE
    doc = json.loads(p.read_text())
    doc["specializations"]["add.float32.N4096.c"]["route"] = "kernel"
    doc["specializations"]["add.float32.N4096.c"]["points"][0]["timing"]["verdict"] = "kernel_faster"
    p.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    with pytest.raises(BundleIntegrityError) as exc:
        load(verified_copy)
    assert "evidence/verification.json" in str(exc.value) and "tampered" in str(exc.value)


# -- routing ------------------------------------------------------------------------

def _timing(verdict: str) -> dict:
    k, r = {"kernel_faster": (10.0, 20.0), "reference_faster": (20.0, 10.0), "no_difference": (10.0, 10.2)}[verdict]
    return {"kernel": {"median_us": k}, "reference": {"median_us": r}, "noise_us": 0.5, "verdict": verdict,
            "speedup": r / k}


def _entry(dyn: str | None, points: list[tuple[dict, str]], *, passed: bool = True, device_type: str = "cpu") -> dict:
    pts = [{"dims": d, "passed": passed, "failure": None if passed else "wrong", "timing": _timing(v)}
           for d, v in points]
    route, why = evidence.pinned_mark(pts, passed)
    return {"device_type": device_type, "dynamic_dim": dyn, "passed": passed,
            "failure": None if passed else "at N=1: wrong", "route": route, "route_reason": why, "points": pts}


def _write_synthetic(root: Path, specs: dict, *, device=None, lock=None) -> None:
    from tileship.build.lock import lock_digest, read_lock

    release_id = json.loads((root / "manifest.json").read_text())["release_id"]
    evidence.write(root, {"schema": 1, "release_id": release_id, "created": "2026-11-29T00:00:00Z",
                          "lock_digest": lock or lock_digest(read_lock(root / "tileship.lock")), "device": device,
                          "host": evidence.current_host(), "options": {}, "specializations": specs})


SYNTHETIC = {
    "add.float32.N1-16777216.c": _entry("N", [({"N": 1}, "reference_faster"), ({"N": 256}, "reference_faster"),
                                              ({"N": 4096}, "kernel_faster"), ({"N": 65536}, "no_difference")]),
    "add.float32.N4096.c": _entry(None, [({"N": 4096}, "kernel_faster")]),
    "rmsnorm_cpu.float32.M1-4096_N1024.c": _entry("M", [({"M": 1, "N": 1024}, "reference_faster"),
                                                        ({"M": 4096, "N": 1024}, "reference_faster")]),
    "rmsnorm_cpu.float32.M64_N256.c": _entry(None, [({"M": 64, "N": 256}, "kernel_faster")], passed=False),
}


def test_routing_pinned_keeps_the_verify_time_marks(cpu_release):
    from tileship.runtime.loader import load

    _write_synthetic(cpu_release, SYNTHETIC)
    rel = load(cpu_release, routing="pinned")
    assert rel.decisions() == {
        "add": {"add.float32.N1-16777216.c": "reference:slower_than_reference", "add.float32.N4096.c": "kernel:kernel"},
        "rmsnorm_cpu": {"rmsnorm_cpu.float32.M1-4096_N1024.c": "reference:slower_than_reference",
                        "rmsnorm_cpu.float32.M64_N256.c": "reference:verification_failed"},
    }
    for n in (10, 100_000):  # nothing changes with the size under pinned
        assert rel.op("add").call(torch.randn(n), torch.randn(n))[1].reason == "slower_than_reference"


def test_routing_by_evidence_chooses_per_size_on_the_slow_path_only(cpu_release):
    from tileship.runtime.loader import load

    _write_synthetic(cpu_release, SYNTHETIC)
    before = nojit.attempts()
    rel = load(cpu_release, routing="evidence")
    op = rel.op("add")
    dyn = next(e for e in op.entries if e.spec.id == "add.float32.N1-16777216.c")
    assert (
        dyn.decision.path == "kernel"
        and dyn.detail == "evidence per size: reference at N=1..256, kernel at N=4096..65536"
    )
    asked = []
    rule = dyn.choose
    dyn.choose = lambda dims: asked.append(dict(dims)) or rule(dims)
    # nearest verified size on a log scale decides: 300 -> 256 (reference), 3000 -> 4096 (kernel)
    for n, want in [(10, ("reference", "slower_than_reference")), (300, ("reference", "slower_than_reference")),
                    (3000, ("kernel", "kernel")), (100_000, ("kernel", "kernel")),
                    (10, ("reference", "slower_than_reference"))]:
        a, b = torch.randn(n), torch.randn(n)
        out, d = op.call(a, b)
        assert (d.path, d.reason) == want, n
        assert torch.allclose(out, a + b)
    assert [x["N"] for x in asked] == [10, 300, 3000, 100_000]  # once per new shape, never per call
    assert rel.decisions()["rmsnorm_cpu"]["rmsnorm_cpu.float32.M1-4096_N1024.c"] == "reference:slower_than_reference"
    assert rel.decisions()["add"]["add.float32.N4096.c"] == "kernel:kernel"
    assert nojit.attempts() == before


def test_evidence_from_another_lock_is_ignored(cpu_release):
    from tileship.runtime.loader import load

    _write_synthetic(cpu_release, SYNTHETIC, lock="sha256:" + "0" * 64)
    rel = load(cpu_release, routing="pinned")
    # CPU kernels run unverified, as without evidence; even the recorded failure does not apply
    assert all(v == "kernel:kernel" for ops in rel.decisions().values() for v in ops.values())
    assert any("another lock/release: it is ignored" in n for n in rel.status()["notes"])


CUDA = Target("cuda-sm90a")
LOCK = "sha256:" + "1" * 64


def _cuda_ev(device, *, passed=True, verdict="kernel_faster"):
    entry = _entry(None, [({"M": 4096, "N": 4096, "K": 4096}, verdict)], passed=passed, device_type="cuda")
    return {"schema": 1, "lock_digest": LOCK, "device": device, "specializations": {"gemm.x": entry}}


@pytest.mark.parametrize(("here", "ev", "allow", "want"), [
    (H200, None, False, "unverified"),
    (H200, None, True, None),
    (H200, "h200", False, None),
    (H100, "h200", False, "unverified"),
    (H100, "h200", True, None),
    (None, "h200", False, "unverified"),
    (H100, "h200-failed", True, "verification_failed"),
    (H200, "h200-slower", False, "slower_than_reference"),
], ids=["none", "none-allowed", "same-gpu", "other-gpu", "other-gpu-allowed", "no-gpu", "failed-anywhere", "slower"])
def test_cuda_routing_needs_evidence_from_this_gpu(monkeypatch, here, ev, allow, want):
    monkeypatch.setattr(evidence, "current_device", lambda: here)
    doc = {None: None, "h200": _cuda_ev(H200), "h200-failed": _cuda_ev(H200, passed=False),
           "h200-slower": _cuda_ev(H200, verdict="reference_faster")}[ev]
    for routing in ("pinned", "evidence"):
        assert evidence.route(doc, "gemm.x", target=CUDA, routing=routing, allow_unverified=allow,
                              lock_digest=LOCK) == want


def test_status_says_an_unverified_release_serves_the_reference_on_a_gpu(monkeypatch, cpu_release):
    from tileship.runtime import loader

    monkeypatch.setattr(loader, "_device_state", lambda: {"cuda": True, "capability": (9, 0)})
    monkeypatch.setattr(evidence, "current_device", lambda: H200)
    notes = loader.load(cpu_release).status()["notes"]
    assert (
        "release has no verification evidence: CUDA specializations serve the reference (allow_unverified is off)"
        in notes
    )
    notes = loader.load(cpu_release, allow_unverified=True).status()["notes"]
    assert "release has no verification evidence: CUDA kernels run UNVERIFIED (allow_unverified is on)" in notes
    specs = {"gemm.x": _entry(None, [({"M": 1}, "kernel_faster")], device_type="cuda")}
    _write_synthetic(cpu_release, specs, device=H100)
    notes = loader.load(cpu_release).status()["notes"]
    assert any(
        n.startswith("verification evidence was taken on NVIDIA H100 80GB HBM3 (cc 9.0, 132 SMs), this is NVIDIA H200")
        and n.endswith("serve the reference (allow_unverified is off)")
        for n in notes
    ), notes


# -- command line ---------------------------------------------------------------------

def test_cli_verify_reports_failures_and_accepts_tolerance_overrides(faulty, tmp_path):
    from tileship.cli import app

    root = tmp_path / faulty.release_id
    shutil.copytree(faulty.path, root)
    runner = CliRunner()
    r = runner.invoke(app, ["verify", str(root), "--no-timing", "--seeds", "0", "--grid", "0"])
    assert r.exit_code == 2, r.output
    assert "failed wrong_add.float32.N4096.c: at N=4096: 43 of 4096 elements beyond" in r.output
    assert "evidence written to" in r.output
    r = runner.invoke(app, ["verify", str(root), "--no-timing", "--seeds", "0", "--only", "wrong_add",
                            "--tolerance", "wrong_add:float32=20,20"])
    assert r.exit_code == 0, r.output
    entry = evidence.read(root)["specializations"]["wrong_add.float32.N4096.c"]
    assert entry["passed"] and entry["tolerance"] == {"atol": 20.0, "rtol": 20.0, "overridden": True}
    r = runner.invoke(app, ["verify", str(root), "--tolerance", "wrong_add=1e-3"])
    assert r.exit_code != 0 and "expected OP:DTYPE=ATOL,RTOL" in " ".join(r.output.replace("│", " ").split())


def test_python_dash_m_cli_lists_verify_and_report():
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(TESTS.parent / "src")}
    out = subprocess.run([sys.executable, "-m", "tileship.cli", "--help"], check=False, capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "verify" in out.stdout and "report" in out.stdout


def test_a_reference_of_another_dtype_than_declared_fails_verification():
    """The reference serves after a failed verify and for undeclared shapes: its dtype must be the declared one,
    or the caller's result dtype would depend on the path (probe round 16, F5)."""
    def kernel(a, b):
        out = torch.empty(a.shape, dtype=a.dtype)
        out.copy_(a + b)
        return out

    v = verify_spec(FAKE_SPEC, kernel, lambda a, b: (a + b).double(), FAKE_DESC,
                    options=VerifyOptions(seeds=(0,), timing=False))
    assert not v.passed and ("fake.reference: output 'C' of the call is float64 [64]; the operator declares it "
                             "float32 [64] for this call") in v.failure, v.failure
