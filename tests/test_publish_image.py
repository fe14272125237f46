"""``tileship publish --image-digest``: the image built from a release is recorded next to it in the
registry (the release unchanged: same id, manifest and signature), and a server compares the image it
runs in with that record (issue 18, item 3)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_registry import fake_release
from typer.testing import CliRunner

from tileship.cli import app
from tileship.errors import RegistryError
from tileship.release import bundle, images
from tileship.release.registry import Registry
from tileship.serve.holder import image_check

DIGEST = "sha256:" + "c" * 64
LOCKED = "sha256:" + "d" * 64


def _publish(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["publish", *args], catch_exceptions=False)
    return r.exit_code, r.output


def test_publish_records_the_image_and_leaves_the_release_unchanged(tmp_path: Path) -> None:
    src, rid = fake_release(tmp_path, "a")
    key = tmp_path / "k.pem"
    bundle.generate_key(key)
    bundle.sign(src, key)
    manifest, sig = (src / bundle.MANIFEST).read_bytes(), (src / bundle.SIGNATURE).read_bytes()
    code, out = _publish(str(src), "--registry", str(tmp_path / "reg"), "--image-digest", DIGEST)
    assert code == 0, out
    assert f"image {DIGEST} recorded for {rid}" in " ".join(out.split())
    reg = Registry(tmp_path / "reg")
    assert reg.image_digest(rid) == DIGEST
    assert json.loads((tmp_path / "reg" / "images" / f"{rid}.json").read_text()) == {
        "image_digest": DIGEST,
        "release_id": rid,
    }
    copy = reg.path_of(rid)
    assert (copy / bundle.MANIFEST).read_bytes() == manifest and (copy / bundle.SIGNATURE).read_bytes() == sig
    assert bundle.check_integrity(copy)["release_id"] == rid  # nothing was added to the published copy


def test_publishing_again_replaces_the_record_and_without_the_flag_keeps_it(tmp_path: Path) -> None:
    src, rid = fake_release(tmp_path, "a")
    reg = Registry(tmp_path / "reg")
    assert reg.publish(src) == rid and reg.image_digest(rid) is None
    reg.publish(src, image_digest=DIGEST)  # the identical release again: a no-op for the copy, the record is new
    assert reg.image_digest(rid) == DIGEST
    reg.publish(src)
    assert reg.image_digest(rid) == DIGEST
    reg.publish(src, image_digest=LOCKED)
    assert reg.image_digest(rid) == LOCKED


@pytest.mark.parametrize("bad", ["sha256:abc", "c" * 64, "sha256:" + "C" * 64, "nvidia/cuda:13.0"], ids=str)
def test_a_malformed_digest_is_refused_before_anything_is_published(tmp_path: Path, bad: str) -> None:
    src, _ = fake_release(tmp_path, "a")
    with pytest.raises(RegistryError, match="is not sha256:<64 hex>"):
        Registry(tmp_path / "reg").publish(src, image_digest=bad)
    assert not (tmp_path / "reg" / "releases").exists()
    code, out = _publish(str(src), "--registry", str(tmp_path / "reg2"), "--image-digest", bad)
    assert code == 1 and "is not sha256:<64 hex>" in " ".join(out.split()), out
    assert not (tmp_path / "reg2" / "releases").exists()


def test_a_server_compares_its_image_with_the_published_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, rid = fake_release(tmp_path, "a")
    reg = Registry(tmp_path / "reg")
    reg.publish(src, image_digest=DIGEST)
    served = SimpleNamespace(path=reg.path_of(rid), lock={"image_digest": LOCKED})
    monkeypatch.setenv("TILESHIP_IMAGE_DIGEST", DIGEST)
    # the record wins over the lock
    assert image_check(served) == {"running": DIGEST, "pinned": DIGEST, "mismatch": False}
    monkeypatch.setenv("TILESHIP_IMAGE_DIGEST", LOCKED)
    assert image_check(served) == {"running": LOCKED, "pinned": DIGEST, "mismatch": True}
    # the same release outside a registry (or with no record) is pinned by its lock, as before
    assert image_check(SimpleNamespace(path=src, lock={"image_digest": LOCKED}))["mismatch"] is False
    assert images.pinned(tmp_path / "reg" / "releases" / "0123456789abcdef", {"image_digest": None}) is None
