"""Hostile files inside a release (found by a tamper hunt, 2026-12-05): a manifest, lock, evidence or
release description that is not what tileship writes is refused naming the file and the field, never
a traceback. Before: a 5000-digit number or 100k nested brackets in ``manifest.json`` escaped as a
ValueError / RecursionError from ``load``, ``inspect`` and ``publish``; a lock section of the wrong
type (``backend: x``) an AttributeError from the drift comparison; evidence whose ``device`` or
specialization entry had the wrong type an AttributeError from routing; a ``release.json`` field of
the wrong type a KeyError / TypeError from the middle of ``load``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tileship.build.lock import lock_digest, read_lock
from tileship.errors import BundleIntegrityError, LockError, SignatureError, TileshipError
from tileship.release import bundle, evidence, integrity, strict_json
from tileship.runtime.loader import load

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                    max_leaves=20)
HOSTILE_JSON = {
    "huge-number": (b'{"files": {}, "n": ' + b"9" * 5000 + b"}", "digit"),
    "deep-nesting": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "invalid-utf8": (b'{"release_id": "\xff\xfe"}', "utf-8"),
    "duplicate-key": (b'{"files": {}, "files": {"x": 1}}', "key 'files' appears twice"),
}


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_strict_json_reads_everything_json_dumps_writes(value: Any) -> None:
    assert strict_json.loads(json.dumps(value), "f.json") == value


@pytest.mark.parametrize("case", HOSTILE_JSON, ids=list(HOSTILE_JSON))
def test_strict_json_refuses_hostile_input_naming_the_file(case: str) -> None:
    body, words = HOSTILE_JSON[case]
    with pytest.raises(BundleIntegrityError) as e:
        strict_json.loads(body, "dir/f.json", "manifest")
    assert e.value.message.startswith("dir/f.json: manifest is not valid JSON") and words in e.value.message.lower()
    with pytest.raises(SignatureError):  # the caller's error class, for the signature file
        strict_json.loads(body, "dir/f.sig", "signature file", SignatureError)


@pytest.mark.parametrize("case", HOSTILE_JSON, ids=list(HOSTILE_JSON))
def test_a_hostile_manifest_is_refused_by_load_and_check(cpu_release: Path, case: str) -> None:
    (cpu_release / "manifest.json").write_bytes(HOSTILE_JSON[case][0])
    for read in (lambda: integrity.check(cpu_release, trusted_keys=[]), lambda: load(cpu_release)):
        with pytest.raises(BundleIntegrityError, match="manifest.json: manifest is not valid JSON"):
            read()


def test_a_manifest_listing_its_files_twice_is_refused(cpu_release: Path) -> None:
    """The release id matches the second ``files``; a reader keeping the first would see other files."""
    body = (cpu_release / "manifest.json").read_text()
    doubled = body.replace('"files": {', '"files": {"specs/evil.so": "sha256:' + "0" * 64 + '"}, "files": {', 1)
    (cpu_release / "manifest.json").write_text(doubled)
    with pytest.raises(BundleIntegrityError, match="key 'files' appears twice"):
        integrity.check(cpu_release, trusted_keys=[])


def _edit_json(rel: str, edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        data = json.loads((root / rel).read_text())
        edit(data)
        (root / rel).parent.mkdir(exist_ok=True)
        (root / rel).write_text(json.dumps(data))

    return apply


def _set(*keys: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        for k in keys[:-1]:
            data = data[k]
        data[keys[-1]] = value

    return edit


def _edit_lock(edit: Callable[[dict[str, Any]], None] | bytes) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        if isinstance(edit, bytes):
            (root / "tileship.lock").write_bytes(edit)
            return
        data = yaml.safe_load((root / "tileship.lock").read_text())
        edit(data)
        (root / "tileship.lock").write_text(yaml.safe_dump(data))

    return apply


LOCK_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "backend-not-a-mapping": (_edit_lock(_set("backend", value="x")), "backend must be a mapping"),
    "backend-null": (_edit_lock(_set("backend", value=None)), "backend must be a mapping"),
    "framework-a-list": (_edit_lock(_set("framework", value=[1])), "framework must be a mapping"),
    "device-arch-a-number": (_edit_lock(_set("device_arch", value=5)), "device_arch must be a mapping"),
    "gpu-a-string": (_edit_lock(_set("device_arch", "gpu", value="H200")), "device_arch.gpu must be a mapping"),
    "targets-a-string": (_edit_lock(_set("device_arch", "targets", value="c")), "device_arch.targets must be"),
    "native-libs-a-list": (_edit_lock(_set("backend", "tilelang_native_libs", value=["x"])),
                           "backend.tilelang_native_libs must be a mapping"),
    "pins-a-string": (_edit_lock(_set("reference_modules", value="x")), "reference_modules must be a mapping"),
    "pin-a-list": (_edit_lock(_set("reference_modules", "add", value=[])), "reference_modules.add must be"),
    "revision-a-list": (_edit_lock(_set("kernel_revision", value=[])), "kernel_revision must be a string"),
    "invalid-utf8": (_edit_lock(b"schema: 1\nkernel_revision: \xff\xfe\n"), "not valid YAML"),
    "huge-number": (_edit_lock(b"schema: 1\nkernel_revision: " + b"9" * 5000 + b"\n"), "not valid YAML"),
    "deep-nesting": (_edit_lock(b"schema: 1\nx: " + b"[" * 20_000 + b"]" * 20_000 + b"\n"), "nested too deeply"),
}


@pytest.mark.parametrize("case", LOCK_CASES, ids=list(LOCK_CASES))
def test_a_malformed_lock_is_refused_naming_the_file_and_field(cpu_release: Path, case: str) -> None:
    tamper, words = LOCK_CASES[case]
    tamper(cpu_release)
    bundle.write_manifest(cpu_release)  # an unsigned release re-hashed by whoever edited it
    with pytest.raises(LockError) as e:
        load(cpu_release)
    assert "tileship.lock" in e.value.message and words in e.value.message, e.value.message


def test_every_lock_tileship_writes_passes_the_check(cpu_release: Path) -> None:
    assert read_lock(cpu_release / "tileship.lock")["schema"] == 1


def _evidence(root: Path, **spec_entry: Any) -> dict[str, Any]:
    """Evidence that applies on this machine, for the dynamic ``add`` (evidence routing reads its points)."""
    lock = read_lock(root / "tileship.lock")
    entry = {"device_type": "cpu", "passed": True, "dynamic_dim": "N", "route": "kernel",
             "points": [{"dims": {"N": 1}, "timing": {"verdict": "kernel_faster"}},
                        {"dims": {"N": 4096}, "timing": {"verdict": "reference_faster"}}], **spec_entry}
    return {"schema": 1, "release_id": bundle.read_manifest(root)["release_id"], "lock_digest": lock_digest(lock),
            "device": None, "host": evidence.current_host(), "specializations": {"add.float32.N1-16777216.c": entry}}


EVIDENCE_CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "device-a-string": (_set("device", value="H200"), "device must be an object or null"),
    "host-a-list": (_set("host", value=[]), "host must be an object or null"),
    "entry-null": (_set("specializations", "add.float32.N1-16777216.c", value=None),
                   "specializations.add.float32.N1-16777216.c must be an object"),
    "passed-a-string": (_set("specializations", "add.float32.N1-16777216.c", "passed", value="yes"),
                        ".passed must be true or false"),
    "points-an-object": (_set("specializations", "add.float32.N1-16777216.c", "points", value={}),
                         ".points must be a list"),
    "point-without-the-dynamic-dim": (_set("specializations", "add.float32.N1-16777216.c", "points", 0, "dims",
                                           value={}), ".points[0].dims.N must be an integer"),
    "size-a-string": (_set("specializations", "add.float32.N1-16777216.c", "points", 1, "dims", value={"N": "4k"}),
                      ".points[1].dims must be an object of integer sizes"),
    "timing-a-list": (_set("specializations", "add.float32.N1-16777216.c", "points", 0, "timing", value=[]),
                      ".points[0].timing must be null or an object"),
    "tuning-a-list": (_set("tuning", value=[]), "tuning must be an object or null"),
    "bucket-missing": (_set("tuning", value={"g": {"dynamic_dim": "N", "candidates": ["a"], "points": [{}]}}),
                       "tuning.g.points[0].bucket must be [first, last] sizes"),
}


def test_well_formed_evidence_routes_per_size(cpu_release: Path) -> None:
    """The base of the cases below is evidence the loader uses: each case breaks one field of it."""
    _edit_json(evidence.EVIDENCE, lambda d: d.update(_evidence(cpu_release)))(_empty(cpu_release))
    bundle.write_manifest(cpu_release)
    rel = load(cpu_release, routing="evidence")
    assert rel.evidence_seal.state == "unchecked"
    assert any("evidence per size" in e.detail for op in rel.ops.values() for e in op.entries), rel.decisions()
    rel.close()


def _empty(root: Path) -> Path:
    (root / "evidence").mkdir(exist_ok=True)
    (root / evidence.EVIDENCE).write_text("{}")
    return root


@pytest.mark.parametrize("case", EVIDENCE_CASES, ids=list(EVIDENCE_CASES))
def test_malformed_evidence_is_refused_naming_the_file_and_field(cpu_release: Path, case: str) -> None:
    edit, words = EVIDENCE_CASES[case]
    data = _evidence(cpu_release)
    edit(data)
    _empty(cpu_release)
    (cpu_release / evidence.EVIDENCE).write_text(json.dumps(data))
    bundle.write_manifest(cpu_release)
    with pytest.raises(BundleIntegrityError) as e:
        load(cpu_release, routing="evidence")
    assert "evidence/verification.json: malformed evidence" in e.value.message and words in e.value.message, \
        e.value.message


RELEASE_CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "operators-a-list": (_set("operators", value=[]), "operators must be an object"),
    "operator-null": (_set("operators", "add", value=None), "operators.add must be an object"),
    "reference-a-number": (_set("operators", "add", "reference", value=5), "operators.add.reference must be"),
    "inputs-a-string": (_set("operators", "add", "inputs", value="A"), "operators.add.inputs must be a list"),
    "specializations-a-string": (_set("specializations", value="x"), "specializations must be an object"),
    "spec-of-no-operator": (_set("specializations", "add.float32.N4096.c", "spec", "op", value="nope"),
                            "spec.op must be the name of a described operator"),
    "spec-dims-a-number": (_set("specializations", "add.float32.N4096.c", "spec", "dims", value=5),
                           "malformed release description (TypeError"),
    "policy-a-list": (_set("policy", value=["strict"]), "policy must be an object"),
    "model-a-number": (_set("model", value=3), "model must be an object"),
    # before: loaded, then an AttributeError (getattr(torch, "float17")) from the server's answer check
    "tensor-dtype-unknown": (_set("operators", "add", "tensor_dtypes", value={"C": "float17"}),
                             "operators.add.tensor_dtypes.C must be \"same\" or one of float16"),
}


@pytest.mark.parametrize("case", RELEASE_CASES, ids=list(RELEASE_CASES))
def test_a_malformed_release_description_is_refused_naming_the_file(cpu_release: Path, case: str) -> None:
    edit, words = RELEASE_CASES[case]
    _edit_json("release.json", edit)(cpu_release)
    bundle.write_manifest(cpu_release)
    with pytest.raises(TileshipError) as e:
        load(cpu_release)
    assert isinstance(e.value, BundleIntegrityError), repr(e.value)
    assert "release.json: malformed release description" in e.value.message and words in e.value.message, \
        e.value.message


@pytest.mark.parametrize("case", ["huge-number", "deep-nesting", "duplicate-key"])
def test_a_hostile_active_pointer_is_a_registry_error(tmp_path: Path, case: str) -> None:
    from tileship.errors import RegistryError
    from tileship.release.registry import Registry

    reg = Registry(tmp_path / "reg")
    reg.root.mkdir()
    reg.pointer.write_bytes(HOSTILE_JSON[case][0])
    with pytest.raises(RegistryError, match="active.json: not valid JSON"):
        reg.active()


def test_the_registry_lists_a_published_release_with_hostile_files_without_a_traceback(cpu_release: Path,
                                                                                        tmp_path: Path) -> None:
    """publish checks integrity only, so an unsigned release with a deeply nested release.json and
    evidence is published; listing the registry must still work (before: a RecursionError)."""
    from tileship.release.registry import Registry

    deep = HOSTILE_JSON["deep-nesting"][0]
    (cpu_release / "release.json").write_bytes(deep)
    _empty(cpu_release)
    (cpu_release / evidence.EVIDENCE).write_bytes(deep)
    bundle.write_manifest(cpu_release)
    reg = Registry(tmp_path / "reg")
    rid = reg.publish(cpu_release)
    (reg.root / "images").mkdir()
    (reg.root / "images" / f"{rid}.json").write_bytes(deep)
    [info] = reg.releases()
    assert (info.release_id, info.model, info.integrity_ok) == (rid, "?", True)
    assert info.verification == "unreadable" and "nested too deeply" in info.verification_detail, info
    assert reg.image_digest(rid) is None
    with pytest.raises(BundleIntegrityError, match="release.json: release description is not valid JSON"):
        load(reg.path_of(rid))


@pytest.mark.parametrize("command", [["verify"], ["explain", "@", "add", "N=4096"], ["report", "@", "-o", "OUT"],
                                     ["tune"]], ids=lambda c: c[0])
def test_commands_reading_release_json_name_a_hostile_one(cpu_release: Path, tmp_path: Path,
                                                          command: list[str]) -> None:
    """Before: verify, explain, report and tune raised RecursionError from json.loads (a traceback)."""
    from typer.testing import CliRunner

    from tileship.cli import app

    (cpu_release / "release.json").write_bytes(HOSTILE_JSON["deep-nesting"][0])
    bundle.write_manifest(cpu_release)
    args = [str(cpu_release) if a == "@" else str(tmp_path / "out") if a == "OUT" else a for a in command]
    if len(args) == 1:
        args.append(str(cpu_release))
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), repr(res.exception)
    flat = "".join(res.output.split())  # rich wraps long paths anywhere
    assert "release.json:releasedescriptionisnotvalidJSON(nestedtoodeeply)" in flat, res.output


HOSTILE_TOML = {
    "invalid-utf8": (b'model = "\xff\xfe"\n', "utf-8"),
    "deep-arrays": (b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply"),
    "deep-inline-tables": (b"x = " + b"{a=" * 3000 + b"1" + b"}" * 3000 + b"\n", "nested too deeply"),
    "huge-number": (b"model_version = " + b"9" * 5000 + b"\n", "digits"),
    "not-toml": (b"model = = 1\n", "not valid TOML"),
}


@pytest.mark.parametrize("name", ["tileship.toml", "pyproject.toml"])
@pytest.mark.parametrize("case", HOSTILE_TOML, ids=list(HOSTILE_TOML))
def test_a_hostile_project_file_is_a_declaration_error_naming_it(tmp_path: Path, case: str, name: str) -> None:
    """Before: invalid UTF-8, deep nesting and overlong integers escaped as UnicodeDecodeError,
    RecursionError and ValueError; any error in pyproject.toml escaped as TOMLDecodeError."""
    from tileship.declare.project import find_project
    from tileship.errors import DeclarationError

    body, words = HOSTILE_TOML[case]
    (tmp_path / name).write_bytes(body)
    with pytest.raises(DeclarationError) as e:
        find_project(tmp_path)
    assert e.value.message.startswith(f"{tmp_path / name}: not valid TOML") and words in e.value.message, \
        e.value.message


@pytest.mark.parametrize("targets", ["5", "true", "[1]", "[[\"c\"]]", "{c = 1}"])
def test_project_targets_of_the_wrong_type_name_the_field(tmp_path: Path, targets: str) -> None:
    from tileship.declare.project import find_project
    from tileship.errors import DeclarationError

    (tmp_path / "tileship.toml").write_text(f'model = "m"\noperators = ["mod"]\ntargets = {targets}\n')
    with pytest.raises(DeclarationError, match="tileship.toml.targets: must be a list of target names"):
        find_project(tmp_path)


@pytest.mark.parametrize(("name", "size"), [("manifest.json", (64 << 20) + 1), ("manifest.sig", (64 << 10) + 1)])
def test_an_oversized_manifest_or_signature_is_refused_from_its_size(cpu_release: Path, name: str,
                                                                     size: int) -> None:
    """Before: read whole into memory (a 10 GB manifest.json in a directory being published)."""
    with open(cpu_release / name, "wb") as f:
        f.truncate(size)  # sparse: no disk used
    with pytest.raises(BundleIntegrityError, match=f"{name}: larger than"):
        integrity.check(cpu_release, trusted_keys=[])
