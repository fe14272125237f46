"""The build refuses a kernel whose parameters disagree with its declaration (``declare/contract.py``),
before compiling it and with an error naming the argument; a kernel that agrees builds as before."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tilelang")

from tests import contract_ops  # noqa: E402

from tileship.build.builder import compile_one  # noqa: E402
from tileship.declare.spec import expand  # noqa: E402


@pytest.mark.parametrize(("op", "words"), [
    (contract_ops.inrank, "A (the kernel's parameter A): declared with 1 dims ('N',) but the kernel's has 2 (128, 4)"),
    (contract_ops.outshape, "B (the kernel's parameter B): dim 0 is N = 128 in the declaration but 256 in the kernel"),
    (contract_ops.outdtype, "B (the kernel's parameter B): declared float32 but the kernel's is float16"),
    (contract_ops.swapped_in, "the declaration lists B, A, C_ but the kernel takes A, B, C_"),
])
def test_a_kernel_that_disagrees_with_its_declaration_is_refused(op, words, tmp_path: Path) -> None:
    (spec,) = expand(op)
    r = compile_one(op, spec, tmp_path / spec.id, timeout_s=300)
    assert not r.ok and "BuildError" in r.error and words in r.error, r.error
    assert not (tmp_path / spec.id / "artifact.json").exists()  # refused before anything was compiled


def test_a_kernel_that_agrees_builds(tmp_path: Path) -> None:
    (spec,) = expand(contract_ops.sub)
    r = compile_one(contract_ops.sub, spec, tmp_path / spec.id, timeout_s=300)
    assert r.ok, r.error
