"""Signed evidence (issue 17, item 3): `verify` and `tune` sign the evidence with a verifier key (a
role apart from the build key); when verifier keys are trusted, unsigned, forged or misdirected
evidence is ignored and the release serves as unverified, saying why; a server reports the release
id with the digest of the evidence in effect (GET /v2, x-tileship-evidence, tileship_release_info)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_serve import copy_release, serving

from tileship.release import bundle, evidence, evidence_seal
from tileship.runtime.loader import load
from tileship.verify.spec_check import VerifyOptions
from tileship.verify.verify import verify

QUICK = VerifyOptions(seeds=(0,), timing=False, grid=0, limit=256)
STATIC = "add.float32.N4096.c"


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """name -> (private, public) ed25519 key files: a verifier key, another one, a build key."""
    d = tmp_path_factory.mktemp("keys")
    return {name: (d / name, bundle.generate_key(d / name)) for name in ("verifier", "stranger", "build")}


@pytest.fixture(scope="module")
def signed(cpu_release_build, tmp_path_factory, keys) -> Path:
    """The CPU catalog release verified on this machine, its evidence signed by the verifier key
    (read-only: copy before editing)."""
    dest = tmp_path_factory.mktemp("signed") / cpu_release_build.release_id
    shutil.copytree(cpu_release_build.path, dest)
    result = verify(dest, QUICK, verifier_key=keys["verifier"][0])
    assert result.ok, [v.failure for v in result.failed]
    return dest


@pytest.fixture
def signed_copy(signed, tmp_path) -> Path:
    dest = tmp_path / signed.name
    shutil.copytree(signed, dest)
    return dest


def _forge(root: Path) -> None:
    """An attacker with write access: the evidence now says the static add failed (which sends it to the
    reference), and the manifest is recomputed so integrity holds; the release id does not change."""
    p = root / evidence.EVIDENCE
    doc = json.loads(p.read_text())
    doc["specializations"][STATIC]["passed"] = False
    p.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    bundle.write_manifest(root)


def _decision(rel, spec_id: str) -> str:
    return next(d for op in rel.decisions().values() for s, d in op.items() if s == spec_id)


def test_verify_signs_the_evidence_and_a_trusting_loader_uses_it(signed, keys):
    manifest = bundle.check_integrity(signed)
    assert evidence_seal.SIGNATURE in manifest["files"]  # hashed, and like the evidence not in the release id
    rel = load(signed, trusted_verifier_keys=[keys["verifier"][1]])
    seal = rel.evidence_seal
    assert seal.state == "verified" and seal.signer.startswith("ed25519:")
    assert seal.digest == manifest["files"][evidence.EVIDENCE] == rel.evidence_digest
    assert rel.evidence is not None and not any("ignored" in n for n in rel.notes)
    assert rel.status()["evidence"]["signer"] == seal.signer
    rel.close()


def test_forged_evidence_is_ignored_when_verifier_keys_are_trusted(signed_copy, keys, monkeypatch):
    _forge(signed_copy)
    monkeypatch.delenv("TILESHIP_TRUSTED_VERIFIER_KEYS", raising=False)
    believed = load(signed_copy)  # no verifier key trusted: the forgery decides routing, as before
    assert believed.evidence_seal.state == "unchecked"
    assert _decision(believed, STATIC) == "reference:verification_failed"
    believed.close()
    monkeypatch.setenv("TILESHIP_TRUSTED_VERIFIER_KEYS", str(keys["verifier"][1]))  # as TILESHIP_TRUSTED_KEYS
    rel = load(signed_copy)
    assert rel.evidence is None and rel.evidence_seal.state == "ignored" and rel.evidence_digest == "none"
    assert "signature does not verify" in rel.evidence_seal.reason
    note = next(n for n in rel.notes if n.startswith("verification evidence ignored"))
    assert "serves as unverified" in note
    assert _decision(rel, STATIC) == "kernel:kernel"  # CPU kernels run unverified, as they always could
    rel.close()


@pytest.mark.parametrize("how", ["unsigned", "stranger", "manifest-signature", "malformed", "garbage-evidence"])
def test_evidence_not_signed_by_a_trusted_verifier_key_is_ignored(signed_copy, keys, how):
    sig = signed_copy / evidence_seal.SIGNATURE
    if how == "unsigned":
        sig.unlink()
    elif how == "stranger":  # a real signature over the real evidence, by a key nobody trusts
        key = bundle.load_private_key(keys["stranger"][0])
        body = evidence_seal.DOMAIN + (signed_copy / evidence.EVIDENCE).read_bytes()
        sig.write_text(json.dumps(bundle.signature_record(key, body)))
    elif how == "manifest-signature":  # the build role's signature cannot stand in for the verifier's
        bundle.write_manifest(signed_copy)
        bundle.sign(signed_copy, keys["verifier"][0])
        shutil.copy(signed_copy / "manifest.sig", sig)
    elif how == "malformed":
        sig.write_text("{not json")
    else:  # not even JSON: ignored like any unsigned evidence, not a refused release
        (signed_copy / evidence.EVIDENCE).write_text("garbage")
    bundle.write_manifest(signed_copy)
    rel = load(signed_copy, trusted_verifier_keys=[keys["verifier"][1]])
    assert rel.evidence is None and rel.evidence_seal.state == "ignored", rel.evidence_seal
    want = {"unsigned": "unsigned", "stranger": "does not verify", "manifest-signature": "does not verify",
            "malformed": "malformed", "garbage-evidence": "does not verify"}[how]
    assert want in rel.evidence_seal.reason
    assert any(n.startswith("verification evidence ignored") for n in rel.notes)
    rel.close()


def test_on_a_gpu_ignored_evidence_says_cuda_serves_the_reference(signed_copy, keys, monkeypatch):
    from tileship.runtime import loader

    monkeypatch.setattr(loader, "_device_state", lambda: {"cuda": True, "capability": (9, 0), "capabilities": [(9, 0)]})
    (signed_copy / evidence_seal.SIGNATURE).unlink()
    bundle.write_manifest(signed_copy)
    rel = load(signed_copy, trusted_verifier_keys=[keys["verifier"][1]])
    assert ("verification evidence ignored: evidence unsigned (trusted verifier keys are set); the release serves as "
            "unverified: CUDA specializations serve the reference (allow_unverified is off)") in rel.notes, rel.notes
    assert not any(n.startswith("release has no verification evidence") for n in rel.notes)  # one line, not two
    rel.close()


def test_one_key_in_both_roles_is_noted(signed_copy, keys):
    bundle.sign(signed_copy, keys["verifier"][0])  # the verifier key also signs the manifest
    pub = keys["verifier"][1]
    rel = load(signed_copy, trusted_keys=[pub], trusted_verifier_keys=[pub])
    assert rel.evidence_seal.state == "verified"
    assert any(n.startswith("the evidence is signed with the build key") for n in rel.notes), rel.notes
    rel.close()


def test_signed_evidence_of_another_release_is_ignored(signed, keys, tmp_path):
    other = copy_release(signed, tmp_path / "other", version="other")  # same kernels, another release id
    rel = load(other, trusted_verifier_keys=[keys["verifier"][1]])
    assert rel.release_id != bundle.check_integrity(signed)["release_id"]
    assert rel.evidence_seal.state == "ignored" and "signed for release" in rel.evidence_seal.reason
    rel.close()


def test_verify_without_a_key_removes_the_old_signature(signed_copy, keys):
    verify(signed_copy, QUICK)
    assert not (signed_copy / evidence_seal.SIGNATURE).exists()  # a stale signature would vouch for nothing
    rel = load(signed_copy, trusted_verifier_keys=[keys["verifier"][1]])
    assert rel.evidence_seal.reason == "evidence unsigned (trusted verifier keys are set)"
    rel.close()


def test_tune_signs_and_does_not_launder_unsigned_entries(signed_copy, keys):
    from tileship.verify.tune import TuneOptions, tune_release

    _forge(signed_copy)  # the earlier evidence is no longer vouched for by any trusted verifier key
    opts = TuneOptions(seeds=(0,), budget_ms=1.0, warmup_ms=0.5, min_repeats=3, max_repeats=4, rounds=2, limit=64,
                       flush=False, only=("add",))
    data = tune_release(signed_copy, opts, verifier_key=keys["verifier"][0])
    assert STATIC in data["specializations"] and data["specializations"][STATIC]["passed"]  # re-measured
    assert not any(s.startswith("rmsnorm") for s in data["specializations"])  # the forged file's entries are gone
    rel = load(signed_copy, trusted_verifier_keys=[keys["verifier"][1]])
    assert rel.evidence_seal.state == "verified" and rel.evidence is not None and "tuning" in rel.evidence
    rel.close()


def test_cli_verify_signs_with_the_verifier_key(cpu_release, keys):
    from typer.testing import CliRunner

    from tileship.cli import app

    res = CliRunner().invoke(app, ["verify", str(cpu_release), "--seeds", "0", "--no-timing", "--grid", "0",
                                   "--limit", "64", "--only", "add", "--verifier-key", str(keys["verifier"][0])])
    assert res.exit_code == 0, res.output
    assert "evidence signed by verifier key ed25519:" in res.output
    seal = evidence_seal.check_dir(cpu_release, [keys["verifier"][1]])
    assert seal.state == "verified"


def _served_identity(srv) -> tuple[dict, str, dict]:
    import httpx

    base = f"http://127.0.0.1:{srv.port}"
    meta = httpx.get(f"{base}/v2", timeout=10).json()
    header = httpx.get(f"{base}/v2/health/ready", timeout=10).headers["x-tileship-evidence"]
    labels = {}
    for fam in text_string_to_metric_families(httpx.get(f"{base}/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name == "tileship_release_info":
                labels = s.labels
    return meta["release"], header, labels


def test_servers_with_different_evidence_are_told_apart(signed, keys, tmp_path, monkeypatch):
    from tileship.serve import ServeConfig

    a = copy_release(signed, tmp_path / "a")
    b = copy_release(signed, tmp_path / "b")
    doc = json.loads((b / evidence.EVIDENCE).read_text())
    doc["created"] = "2026-01-01T00:00:00Z"  # other evidence, signed by the same verifier
    evidence.write(b, doc, verifier_key=keys["verifier"][0])
    monkeypatch.setenv("TILESHIP_TRUSTED_VERIFIER_KEYS", str(keys["verifier"][1]))
    seen = []
    for root in (a, b):
        with serving(ServeConfig(source=root, diagnostics_dir=tmp_path / f"diag-{root.name}",
                                 log_stream=io.StringIO())) as srv:
            release, header, labels = _served_identity(srv)
        digest = bundle.check_integrity(root)["files"][evidence.EVIDENCE]
        assert release["evidence_digest"] == header == labels["evidence_digest"] == digest
        assert release["evidence"]["state"] == labels["evidence"] == "verified"
        assert labels["release_id"] == release["id"]
        seen.append((release["id"], digest))
    assert seen[0][0] == seen[1][0] and seen[0][1] != seen[1][1]  # one release, two evidence digests


def test_a_server_trusting_verifier_keys_reports_ignored_evidence(signed, keys, tmp_path, monkeypatch):
    from tileship.serve import ServeConfig

    root = copy_release(signed, tmp_path / "forged")
    _forge(root)
    monkeypatch.setenv("TILESHIP_TRUSTED_VERIFIER_KEYS", str(keys["verifier"][1]))
    with serving(ServeConfig(source=root, diagnostics_dir=tmp_path / "diag", log_stream=io.StringIO())) as srv:
        release, header, labels = _served_identity(srv)
    assert header == release["evidence_digest"] == labels["evidence_digest"] == "none"
    assert release["evidence"]["state"] == labels["evidence"] == "ignored"


def test_inspect_says_what_load_makes_of_the_evidence(signed_copy, keys):
    from typer.testing import CliRunner

    from tileship.cli import app

    trust = ["--trusted-verifier-key", str(keys["verifier"][1])]
    res = CliRunner().invoke(app, ["inspect", str(signed_copy), *trust])
    assert res.exit_code == 0 and "evidence verified" in res.output, res.output
    _forge(signed_copy)
    res = CliRunner().invoke(app, ["inspect", str(signed_copy), *trust])
    assert res.exit_code == 0, res.output  # intact: forged evidence is a routing matter, not a refused bundle
    assert "evidence ignored" in res.output and "does not verify" in res.output
    assert res.output.rstrip().splitlines()[-1].startswith("intact")
