"""Declaration errors name the field; expansion gives the expected specializations."""

from __future__ import annotations

import dataclasses

import pytest

from tileship.catalog.cpu import add, rmsnorm_cpu
from tileship.declare.project import parse_project
from tileship.declare.spec import DynamicRange, Target, TensorArg, expand
from tileship.errors import DeclarationError

BAD = [
    ("unknown-dim-in-shape", dict(shapes=({"N": 4, "Q": 3},), ranges=()), "shapes[0].Q"),
    ("empty-shape-set", dict(shapes=(), ranges=()), "shapes"),
    ("reference-missing", dict(reference=None), "reference"),
    ("range-min-gt-max", dict(ranges=(DynamicRange("N", 10, 2),)), "ranges[0].min"),
    ("range-unknown-dim", dict(ranges=(DynamicRange("Z", 1, 2),)), "ranges[0].dim"),
    ("range-min-zero", dict(ranges=(DynamicRange("N", 0, 2),)), "ranges[0].min"),
    ("unknown-dtype", dict(dtypes=("float17",)), "dtypes"),
    ("unknown-target", dict(targets=("cuda-sm90x",)), "targets"),
    ("negative-shape", dict(shapes=({"N": -1},)), "shapes[0].N"),
    ("output-dim-undetermined", dict(outputs=(TensorArg("C", ("Q",)),)), "outputs.C"),
    ("factory-param-missing", dict(config={"blockz": 3}), "config.blockz"),
    ("no-inputs", dict(inputs=()), "inputs"),
]


@pytest.mark.parametrize("change,field", [(c, f) for _, c, f in BAD], ids=[i for i, _, _ in BAD])
def test_bad_declaration_names_the_field(change, field):
    op = dataclasses.replace(add, **change)
    with pytest.raises(DeclarationError) as info:
        op.check()
    assert info.value.field == field, str(info.value)
    assert f"add.{field}" in str(info.value)


def test_expand_static_and_dynamic():
    specs = expand(rmsnorm_cpu)
    ids = sorted(s.id for s in specs)
    assert ids == ["rmsnorm_cpu.float32.M1-4096_N1024.c", "rmsnorm_cpu.float32.M64_N256.c"]
    dyn = next(s for s in specs if s.dynamic_dim)
    assert dyn.dynamic_dim == "M" and dyn.dim_map()["M"] == (1, 4096)


def test_targets_are_dicts_for_cuda():
    assert Target("cuda-sm90a").tilelang() == {"kind": "cuda", "arch": "sm_90a"}
    assert Target("cuda-sm90a").compute_capability == (9, 0)
    assert Target("c").tilelang() == "c" and Target("c").device_type == "cpu"


@pytest.mark.parametrize("data,field", [
    ({"operators": ["x"]}, "t.model"),
    ({"model": "m", "operators": []}, "t.operators"),
    ({"model": "m", "operators": ["x"], "routing": "fastest"}, "t.routing"),
    ({"model": "m", "operators": ["x"], "targets": ["gpu"]}, "t.targets"),
    ({"model": "m", "operators": ["x"], "colour": 1}, "t"),
], ids=["no-model", "no-operators", "bad-routing", "bad-target", "unknown-key"])
def test_bad_project_names_the_key(data, field):
    with pytest.raises(DeclarationError) as info:
        parse_project(data, source="t")
    assert info.value.field == field


@pytest.mark.parametrize("entry,example", [("kernels/myops.py", "kernels.myops"),
                                           ("./kernels/myops.py", "kernels.myops"),
                                           ("kernels..myops", "mypkg.kernels"), ("", "mypkg.kernels")])
def test_an_operator_module_given_as_a_file_is_refused_with_its_module_name(entry, example):
    """``operators = ["kernels/myops.py"]`` failed at import as ``ModuleNotFoundError: No module named
    'kernels/myops'`` (``"./kernels/myops.py"``: a TypeError about relative imports), saying nothing of the fix."""
    with pytest.raises(DeclarationError) as info:
        parse_project({"model": "m", "operators": ["ok.mod", entry]}, source="t")
    assert info.value.field == "t.operators" and f"{entry!r} is not a module name" in str(info.value)
    assert f'e.g. "{example}"' in str(info.value.hint)
