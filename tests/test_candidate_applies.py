"""``Operator.applies``: candidates built for some shapes only. The declaration side (which specializations
exist, the errors that name the candidate, the description the lock hashes) and one real "c" build ->
tune -> load of ``applies_ops.poly_some``, whose shapes have different candidate sets."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import pytest

from tileship.declare.project import Project, load_operators
from tileship.declare.spec import describe, expand
from tileship.errors import DeclarationError

TESTS = Path(__file__).parent
PROJECT = Project(model="applies", model_version="1", operator_modules=("applies_ops",), targets=("c",),
                  routing="evidence", root=TESTS)


def _op():
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    return load_operators(PROJECT)["poly_some"]


def _ids(op) -> set[str]:
    return {s.id for s in expand(op)}


def test_a_candidate_is_built_only_for_the_shapes_it_applies_to() -> None:
    assert _ids(_op()) == {
        "poly_some.float32.N4096.c.rounds1", "poly_some.float32.N4096.c.rounds64",
        "poly_some.float32.N65536.c.rounds1", "poly_some.float32.N65536.c.rounds64",
        "poly_some.float32.N65536.c.rounds1-block128",
    }


def test_applies_sees_the_candidate_laid_over_the_config_and_a_range_as_min_max() -> None:
    from tileship.declare.spec import DynamicRange

    seen: list[tuple[dict, dict]] = []

    def spy(config, dims):
        seen.append((dict(config), dict(dims)))
        return True

    op = dataclasses.replace(_op(), applies=spy, ranges=(DynamicRange("N", 1, 1024),))
    expand(op)
    assert ({"block": 128, "rounds": 1}, {"N": (1, 1024)}) in seen  # config {"block": 256} overridden
    assert ({"block": 256, "rounds": 64}, {"N": 4096}) in seen
    assert ({"block": 256, "rounds": 1}, {"N": 65536}) in seen  # the first one too: it must apply everywhere


@pytest.mark.parametrize("applies,words", [
    (lambda c, d: 1, "must return a bool, got int (candidate rounds1)"),
    (lambda c, d: c["missing"], "applies() raised KeyError: 'missing' (candidate rounds1, dims {'N': 4096})"),
])
def test_a_bad_applies_names_the_candidate_and_the_shape(applies, words) -> None:
    with pytest.raises(DeclarationError) as err:
        expand(dataclasses.replace(_op(), applies=applies))
    assert err.value.field == "applies" and words in str(err.value)


def test_a_rule_that_refuses_the_first_candidate_anywhere_is_refused() -> None:
    """The first candidate serves every shape before tuning: it must exist for each."""
    op = dataclasses.replace(_op(), candidates=[{"rounds": 64}, {"rounds": 1}], applies=lambda c, d: d["N"] > 4096)
    with pytest.raises(DeclarationError, match=r"refuses the first candidate rounds64 at dims \{'N': 4096\}"):
        expand(op)


def test_applies_must_be_callable_and_importable() -> None:
    with pytest.raises(DeclarationError, match="applies is not callable"):
        expand(dataclasses.replace(_op(), applies=3))
    with pytest.raises(DeclarationError):  # a release re-imports it by name: a lambda is refused at build time
        describe(dataclasses.replace(_op(), applies=lambda c, d: True))


def test_the_description_names_the_rule_and_the_lock_changes_with_it() -> None:
    op = _op()
    assert describe(op)["applies"] == "applies_ops.poly_applies"
    assert "applies" not in describe(dataclasses.replace(op, applies=None))  # others' descriptions unchanged


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """poly_some built for "c", one copy tuned on this CPU, one left untuned."""
    from tileship.build.builder import BuildOptions, build
    from tileship.verify.tune import TuneOptions, tune_release

    _op()
    result = build(PROJECT, load_operators(PROJECT), tmp_path_factory.mktemp("applies"), BuildOptions(jobs=2))
    assert result.ok, [f.error for f in result.failed]
    untuned = tmp_path_factory.mktemp("untuned") / result.release_id
    shutil.copytree(result.path, untuned)
    data = tune_release(result.path, TuneOptions(budget_ms=10.0))
    return result.path, untuned, data


def test_the_release_holds_each_shapes_own_candidates_and_tune_weighs_only_those(built) -> None:
    import json

    path, _, data = built
    rel = json.loads((path / "release.json").read_text())
    assert set(rel["specializations"]) == _ids(_op())
    assert rel["operators"]["poly_some"]["applies"] == "applies_ops.poly_applies"
    small = data["tuning"]["poly_some.float32.N4096.c"]
    large = data["tuning"]["poly_some.float32.N65536.c"]
    assert small["candidates"] == ["rounds1", "rounds64"]
    assert large["candidates"] == ["rounds1", "rounds64", "rounds1-block128"]


def test_load_routes_each_shape_among_its_own_candidates(built) -> None:
    import torch

    from tileship.release import tuning
    from tileship.runtime.loader import load

    path, untuned, data = built
    for rel_path, tuned in ((path, True), (untuned, False)):
        runner = load(rel_path).ops["poly_some"]
        for n in (4096, 65536):
            x = torch.randn(n)
            y, d = runner.call(x)
            torch.testing.assert_close(y, ((((x * 0.5 + 1) * x - 2) * x + 0.25) * x + 3), atol=1e-4, rtol=1e-4)
            if not tuned:  # the first declared candidate serves every shape
                assert (d.path, d.spec_id) == ("kernel", f"poly_some.float32.N{n}.c.rounds1"), (n, d)
                continue
            winner, _ = tuning.choice(data["tuning"][f"poly_some.float32.N{n}.c"], {"N": n})
            if winner is None:
                assert d.path == "reference", (n, d)
            else:
                assert winner != "rounds64" and d.spec_id == f"poly_some.float32.N{n}.c.{winner}", (n, d)
