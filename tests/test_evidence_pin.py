"""Evidence freshness (rollback protection for evidence): activation pins the evidence digest in the
registry's pointer; a load through the registry ignores any other evidence (an older, validly signed
file put back, evidence added or removed), names both digests and serves every specialization on the
reference; ``rollback`` restores the earlier pin; a pointer written before pins checks nothing; a user
loading by path pins with ``load(expect_evidence_digest=...)``."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from test_registry import add_evidence, fake_release
from test_serve import serving
from typer.testing import CliRunner

from tileship.errors import RegistryError
from tileship.release import bundle, evidence_seal
from tileship.release.evidence import EVIDENCE
from tileship.release.registry import Active, Registry
from tileship.runtime.loader import load
from tileship.verify.spec_check import VerifyOptions
from tileship.verify.verify import verify

STATIC = "add.float32.N4096.c"
REPLAYED = (EVIDENCE, evidence_seal.SIGNATURE)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(private, public) verifier key files."""
    d = tmp_path_factory.mktemp("pin-keys")
    return d / "verifier", bundle.generate_key(d / "verifier")


@pytest.fixture(scope="module")
def verified_twice(cpu_release_build: Any, tmp_path_factory: pytest.TempPathFactory,
                   keys: tuple[Path, Path]) -> tuple[Path, dict[str, bytes]]:
    """The CPU release verified twice here (other seeds), both times signed by the verifier key: the
    release (holding the newer evidence; read-only) and the older evidence and signature files, kept."""
    root = tmp_path_factory.mktemp("pin-release") / cpu_release_build.release_id
    shutil.copytree(cpu_release_build.path, root)
    for seed in (0, 1):
        result = verify(root, VerifyOptions(seeds=(seed,), timing=False, grid=0, limit=256), verifier_key=keys[0])
        assert result.ok, [v.failure for v in result.failed]
        if seed == 0:
            older = {rel: (root / rel).read_bytes() for rel in REPLAYED}
    assert older[EVIDENCE] != (root / EVIDENCE).read_bytes()
    return root, older


def _put_back(root: Path, files: dict[str, bytes]) -> str:
    """What someone who can write the release does: older evidence and its (valid) signature put back,
    the unsigned manifest recomputed so the integrity check passes. Returns the evidence digest now."""
    for rel, body in files.items():
        (root / rel).write_bytes(body)
    return bundle.write_manifest(root)["files"][EVIDENCE]


def _digest(root: Path) -> str:
    return bundle.check_integrity(root)["files"][EVIDENCE]


def _load_active(reg: Registry, **kw: Any) -> Any:
    """What a server following the registry loads (``holder.resolve`` then the loader, with the pin)."""
    from tileship.serve.holder import resolve

    t = resolve(reg.root)
    return load(t.path, reference_only=t.reference_only, expect_evidence_digest=t.evidence, **kw)


def _decisions(rel: Any) -> set[str]:
    return {d for op in rel.decisions().values() for d in op.values()}


def _strip_pins(reg: Registry) -> None:
    """The pointer as a tileship from before evidence pins wrote it (no ``evidence`` keys)."""
    state = json.loads(reg.pointer.read_text())
    state.pop("evidence", None)
    for h in state["history"]:
        h.pop("evidence", None)
    reg.pointer.write_text(json.dumps(state))


def _infer_add(url: str) -> httpx.Response:
    a, b = [float(i % 7) for i in range(4096)], [1.0] * 4096
    body = {"inputs": [{"name": n, "shape": [4096], "datatype": "FP32", "data": x} for n, x in (("A", a), ("B", b))]}
    r = httpx.post(f"{url}/v2/models/add/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [x + 1.0 for x in a]
    return r


# -- (a), (b): a replay in the registry copy, through a server that follows the registry -----------------

@pytest.mark.parametrize("pointer", ["pinned", "before-pins"])
def test_replayed_evidence_is_ignored_by_a_server_following_the_registry(
        verified_twice: tuple[Path, dict[str, bytes]], keys: tuple[Path, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, pointer: str) -> None:
    from tileship.serve import ServeConfig

    src, older = verified_twice
    monkeypatch.setenv("TILESHIP_TRUSTED_VERIFIER_KEYS", str(keys[1]))
    reg = Registry(tmp_path / "reg")
    rid = reg.publish(src)
    newer = _digest(src)
    reg.activate(rid)
    if pointer == "before-pins":
        _strip_pins(reg)
    replayed = _put_back(reg.path_of(rid), older)
    assert replayed != newer
    by_path = load(reg.path_of(rid))  # the signature is valid for this release: by path, the replay is believed
    assert (by_path.evidence_seal.state, by_path.evidence_digest) == ("verified", replayed)
    by_path.close()
    with serving(ServeConfig(source=reg.root, diagnostics_dir=tmp_path / "d", log_stream=io.StringIO())) as srv:
        url = f"http://127.0.0.1:{srv.port}"
        release = httpx.get(f"{url}/v2", timeout=10).json()["release"]
        seal = release["evidence"]
        r = _infer_add(url)  # answered either way
        notes = httpx.get(f"{url}/v2/health/ready", timeout=10).json()["notes"]
    if pointer == "before-pins":  # nothing pinned: as before, the older evidence is used
        assert release["evidence_digest"] == replayed and r.headers["x-tileship-path"] == "kernel"
        assert (seal["state"], seal["pinned"], seal["stale"]) == ("verified", None, False)
        assert reg.active().evidence is None
        return
    assert seal["state"] == "ignored", seal  # before pins: "verified", the replay believed
    assert replayed in seal["reason"] and newer in seal["reason"], seal["reason"]
    assert seal["stale"] is True and seal["pinned"] == reg.active().evidence == newer, seal
    assert "re-activate" in seal["reason"] and "tileship activate" in seal["reason"]
    assert release["evidence_digest"] == r.headers["x-tileship-evidence"] == "none"
    assert (r.headers["x-tileship-path"], r.headers["x-tileship-reason"]) == ("reference", "unverified")
    assert any(n.startswith("verification evidence ignored: evidence digest") and
               n.endswith("every specialization serves the PyTorch reference") for n in notes), notes


def test_worker_processes_get_the_pin(verified_twice: tuple[Path, dict[str, bytes]], keys: tuple[Path, Path],
                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_serve_workers import workers_server

    src, older = verified_twice
    monkeypatch.setenv("TILESHIP_TRUSTED_VERIFIER_KEYS", str(keys[1]))
    reg = Registry(tmp_path / "reg")
    rid = reg.publish(src)
    reg.activate(rid)
    _put_back(reg.path_of(rid), older)
    with workers_server(reg.root, workers=1, diagnostics_dir=tmp_path / "d") as srv:
        r = _infer_add(srv.url)  # the worker process loaded the release and answered
    assert (r.headers["x-tileship-path"], r.headers["x-tileship-reason"]) == ("reference", "unverified")


def test_diagnose_of_the_active_release_loads_it_as_a_server_would(verified_twice: tuple[Path, dict[str, bytes]],
                                                                     tmp_path: Path) -> None:
    from tileship.cli import app

    src, older = verified_twice
    reg = Registry(tmp_path / "reg")
    rid = reg.publish(src)
    reg.activate(rid)
    _put_back(reg.path_of(rid), older)
    out = tmp_path / "diag"
    r = CliRunner().invoke(app, ["diagnose", "--registry", str(reg.root), "--out", str(out)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    [d] = [p for p in out.iterdir() if p.is_dir()]
    runtime = json.loads((d / "runtime.json").read_text())
    assert runtime["status"]["evidence"]["state"] == "ignored", runtime["status"]["evidence"]  # by path: used
    assert set(d for op in runtime["decisions"].values() for d in op.values()) == {"reference:unverified"}


def test_evidence_added_or_removed_after_activation_is_not_used(verified_twice: tuple[Path, dict[str, bytes]],
                                                                 tmp_path: Path) -> None:
    src, _ = verified_twice
    bare = tmp_path / "bare"
    shutil.copytree(src, bare)
    for rel in REPLAYED:
        (bare / rel).unlink()
    bundle.write_manifest(bare)
    reg = Registry(tmp_path / "reg")
    rid = reg.publish(bare)
    assert reg.activate(rid).evidence == evidence_seal.NO_EVIDENCE
    assert json.loads(reg.pointer.read_text())["evidence"] is None  # null: pinned to no evidence
    (reg.path_of(rid) / "evidence").mkdir(exist_ok=True)
    for rel in REPLAYED:  # evidence appears in the registry copy afterwards
        shutil.copy(src / rel, reg.path_of(rid) / rel)
    bundle.write_manifest(reg.path_of(rid))
    rel_ = _load_active(reg)
    assert rel_.evidence_seal.stale and f"evidence digest {_digest(src)} is not" in rel_.evidence_seal.reason
    assert "pinned when the release was activated (none)" in rel_.evidence_seal.reason
    rel_.close()


# -- the deliberate re-verify: publish --replace, activate ---------------------------------------------

def test_reverify_publish_replace_and_activate_re_pins(verified_twice: tuple[Path, dict[str, bytes]],
                                                       keys: tuple[Path, Path], tmp_path: Path) -> None:
    src, older = verified_twice
    first = tmp_path / "first"
    shutil.copytree(src, first)
    old_digest = _put_back(first, older)  # the release as first verified
    reg = Registry(tmp_path / "reg")
    rid = reg.publish(first)
    assert reg.activate(rid).evidence == old_digest
    assert reg.publish(src, replace=True) == rid  # re-verified since: a new copy <id>@1
    assert reg.path_of(rid).name == f"{rid}@1"
    waiting = _load_active(reg, trusted_verifier_keys=[keys[1]])  # not re-activated yet: not believed
    assert waiting.evidence_seal.stale and _decisions(waiting) == {"reference:unverified"}
    waiting.close()
    active = reg.activate(rid)  # the deliberate step: re-pins in place
    assert active.evidence == _digest(src) and reg.history() == []
    rel = _load_active(reg, trusted_verifier_keys=[keys[1]])
    assert rel.evidence_seal.state == "verified" and rel.evidence_digest == _digest(src)
    assert "kernel:kernel" in _decisions(rel)
    rel.close()


def test_re_pinning_evidence_that_records_a_failure_needs_no_force(tmp_path: Path) -> None:
    src, rid = fake_release(tmp_path, "a")
    add_evidence(src, {"x": True})
    reg = Registry(tmp_path / "reg")
    reg.publish(src)
    reg.activate(rid)
    add_evidence(src, {"x": False})  # re-verified: x is wrong on this device after all
    reg.publish(src, replace=True)
    # the active release re-pinned: its failed specialization serves the reference, as the new evidence says
    assert reg.activate(rid).evidence == bundle.check_integrity(src)["files"][EVIDENCE]
    reg.activate_reference()
    with pytest.raises(RegistryError, match="verification failed"):  # from reference-only back to kernels: checked
        reg.activate(rid)


def test_cli_prints_the_pin_and_says_when_evidence_is_not_the_pinned_one(tmp_path: Path) -> None:
    from tileship.cli import app

    src, rid = fake_release(tmp_path, "a")
    add_evidence(src, {"x": True})
    first = bundle.check_integrity(src)["files"][EVIDENCE]
    reg = ["--registry", str(tmp_path / "reg")]
    runner = CliRunner()

    def run(*args: str) -> str:
        r = runner.invoke(app, [*args, *reg], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return " ".join(r.output.split())  # rich wraps long lines

    run("publish", str(src))
    assert f"evidence pinned: {first}" in run("activate", rid)
    add_evidence(src, {"x": True, "y": True})  # re-verified
    second = bundle.check_integrity(src)["files"][EVIDENCE]
    out = run("publish", str(src), "--replace")
    assert "is active with other evidence pinned" in out and f"tileship activate {rid}" in out
    out = run("releases")
    assert f"evidence pinned: {first}" in out and f"evidence is now {second}" in out, out
    assert f"evidence pinned: {second}" in run("activate", rid)
    out = run("releases")
    assert f"evidence pinned: {second}" in out and "evidence is now" not in out


# -- (c): rollback, history, old pointers ----------------------------------------------------------------

def test_rollback_restores_the_previous_release_pin(tmp_path: Path) -> None:
    from tileship.serve.holder import ReleaseHolder

    src_a, a = fake_release(tmp_path, "a")
    add_evidence(src_a, {"x": True})
    src_b, b = fake_release(tmp_path, "b")
    add_evidence(src_b, {"x": True, "y": True})
    src_c, c = fake_release(tmp_path, "c")  # no evidence
    pa, pb = (bundle.check_integrity(s)["files"][EVIDENCE] for s in (src_a, src_b))
    reg = Registry(tmp_path / "reg")
    for s in (src_a, src_b, src_c):
        reg.publish(s)
    assert reg.activate(a).evidence == pa
    assert reg.activate(b).evidence == pb
    assert reg.activate(c).evidence == "none"
    assert [(h["release_id"], h["evidence"]) for h in reg.history()] == [(b, pb), (a, pa)]
    holder = ReleaseHolder(reg.root, lambda p, r, e: None)  # type: ignore[arg-type,return-value]
    target = holder.rollback_target()
    assert target is not None and (target.path.name, target.evidence) == (b, pb)  # the warm standby's pin too
    ref = reg.activate_reference()
    assert (ref.release_id, ref.reference_only, ref.evidence) == (c, True, "none")
    assert reg.rollback() == Active(c, reg.releases_dir / c, False, b, "none")
    assert reg.rollback() == Active(b, reg.releases_dir / b, False, a, pb)
    assert reg.rollback() == Active(a, reg.releases_dir / a, False, None, pa)
    assert json.loads(reg.pointer.read_text())["evidence"] == pa


def test_activate_with_the_evidence_a_canary_loaded(tmp_path: Path) -> None:
    src, rid = fake_release(tmp_path, "a")
    add_evidence(src, {"x": True})
    loaded = bundle.check_integrity(src)["files"][EVIDENCE]
    reg = Registry(tmp_path / "reg")
    reg.publish(src)
    with pytest.raises(RegistryError, match=f"its evidence is now {loaded}, not none as loaded"):
        reg.activate(rid, evidence="none")  # the evidence changed between the canary's load and its promotion
    assert reg.active().release_id is None
    assert reg.activate(rid, evidence=loaded).evidence == loaded


def test_a_pointer_from_before_pins_still_works(tmp_path: Path) -> None:
    src_a, a = fake_release(tmp_path, "a")
    add_evidence(src_a, {"x": True})
    src_b, b = fake_release(tmp_path, "b")
    reg = Registry(tmp_path / "reg")
    reg.publish(src_a)
    reg.publish(src_b)
    reg.pointer.write_text(json.dumps({"schema": 1, "release_id": a, "reference_only": False,
                                       "history": [{"release_id": b, "reference_only": False}]}))
    assert reg.active() == Active(a, reg.releases_dir / a, False, b, None)  # unpinned: nothing is checked
    assert reg.activate(b).evidence == "none"
    assert reg.history()[0] == {"release_id": a, "reference_only": False}  # stays unpinned
    assert reg.rollback().evidence is None
    assert reg.rollback().evidence is None and reg.active().release_id == b
    state = json.loads(reg.pointer.read_text())
    state["evidence"] = "sha256:not-a-digest"
    reg.pointer.write_text(json.dumps(state))
    with pytest.raises(RegistryError, match="not a tileship active pointer"):
        reg.active()


# -- (d): a user pinning a load by path ------------------------------------------------------------------

def test_load_by_path_with_an_expected_evidence_digest(verified_twice: tuple[Path, dict[str, bytes]],
                                                       keys: tuple[Path, Path]) -> None:
    src, _ = verified_twice
    digest, trust = _digest(src), [keys[1]]
    rel = load(src, trusted_verifier_keys=trust, expect_evidence_digest=digest)
    assert (rel.evidence_seal.state, rel.evidence_seal.pinned, rel.evidence_seal.stale) == ("verified", digest, False)
    assert rel.evidence_digest == digest and "kernel:kernel" in _decisions(rel)
    rel.close()
    other = "sha256:" + "0" * 64
    for expect in (other, "none"):
        rel = load(src, trusted_verifier_keys=trust, expect_evidence_digest=expect)
        seal = rel.evidence_seal
        assert seal.state == "ignored" and seal.stale and seal.pinned == expect and rel.evidence is None
        want = f"evidence digest {digest} is not the one pinned when the release was activated ({expect})"
        assert want in seal.reason, seal.reason
        assert _decisions(rel) == {"reference:unverified"}  # CPU kernels too: nothing native runs
        out, decision = rel.ops["add"].call(torch.ones(4096), torch.ones(4096))
        assert decision.path == "reference" and bool(out.eq(2).all())
        rel.close()
    plain = load(src)  # no pin, no trusted verifier key: as before
    assert plain.evidence_seal.pinned is None and plain.evidence_seal.state == "unchecked"
    plain.close()
