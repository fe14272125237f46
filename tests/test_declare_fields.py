"""Declarations written in ways the checks did not expect (probe ``foreign_kernels_round16``, F6, F7, F10):
each is accepted as what it spells or refused with a ``DeclarationError`` naming the field, never a raw
Python error."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from tileship.build.builder import BuildOptions, build
from tileship.catalog.cpu import add, rmsnorm_cpu
from tileship.declare.project import Project
from tileship.declare.spec import DynamicRange, TensorArg, Tolerance, describe, expand
from tileship.errors import DeclarationError


def test_lists_are_taken_as_the_tuples_they_spell():
    op = dataclasses.replace(add, inputs=list(add.inputs), outputs=list(add.outputs), dtypes=list(add.dtypes),
                             targets=list(add.targets), shapes=[{"N": 64}], ranges=list(add.ranges))
    op.check()
    assert op.inputs == add.inputs and isinstance(op.inputs, tuple) and isinstance(op.shapes, tuple)
    assert [s.id for s in expand(op)] == [s.id for s in expand(dataclasses.replace(add, shapes=({"N": 64},)))]
    assert describe(op)["inputs"] == describe(add)["inputs"]
    assert TensorArg("A", ["N"]).dims == ("N",)


SINGLE = [
    ("inputs-single", dict(inputs=TensorArg("A", ("N",))), "inputs", "got a single TensorArg", "(note the comma)"),
    ("outputs-single", dict(outputs=TensorArg("C", ("N",))), "outputs", "got a single TensorArg", "(note the comma)"),
    ("dtypes-string", dict(dtypes="float32"), "dtypes", "got the string 'float32'", 'dtypes=("float32",)'),
    ("targets-string", dict(targets="c"), "targets", "got the string 'c'", 'targets=("c",)'),
    ("shapes-mapping", dict(shapes={"N": 64}), "shapes", "got a single mapping", "{'N': 64},)"),
    ("ranges-single", dict(ranges=DynamicRange("N", 1, 64)), "ranges", "got a single DynamicRange", "(note the comma)"),
    ("mutates-string", dict(mutates="A"), "mutates", "got the string 'A'", 'mutates=("A",)'),
    ("inputs-set", dict(inputs={TensorArg("A", ("N",))}), "inputs", "got set", "e.g. inputs=("),
    ("dtypes-none", dict(dtypes=None), "dtypes", "got NoneType", 'e.g. dtypes=("float32",)'),
]


@pytest.mark.parametrize("change,field,words,hint", [c[1:] for c in SINGLE], ids=[c[0] for c in SINGLE])
def test_a_field_that_is_not_a_sequence_is_refused_with_the_fix(change, field, words, hint):
    op = dataclasses.replace(add, **change)
    with pytest.raises(DeclarationError) as info:
        op.check()
    assert info.value.field == field and f"add.{field}: must be a tuple" in str(info.value), str(info.value)
    assert words in str(info.value) and hint in str(info.value.hint), str(info.value)


def _double(a):
    return a * 2


def _nested():
    def ref(a, b):
        return a + b

    return ref


class _Callable:
    def __call__(self, a, b):
        return a + b


NOT_IMPORTABLE = [
    ("lambda", "reference", lambda a, b: a + b, f"is a lambda ({__name__}.<lambda>)"),
    ("nested", "reference", _nested(), "is defined inside a function"),
    ("partial", "reference", functools.partial(torch.add, alpha=1), "is a functools.partial"),
    ("object", "reference", _Callable(), "is a _Callable with no __module__ and __qualname__"),
    ("sample-lambda", "sample", lambda dims, dtype, device: (), "is a lambda"),
    ("cost-nested", "cost", _nested(), "is defined inside a function"),
]


@pytest.mark.parametrize("field,fn,words", [c[1:] for c in NOT_IMPORTABLE], ids=[c[0] for c in NOT_IMPORTABLE])
def test_a_callable_a_release_cannot_import_by_name_is_refused_at_build(field, fn, words, tmp_path):
    """The release re-imports the reference (sample, cost) by ``module.qualname``: a lambda would build, then
    fail to load, verify or tune (F7). The build refuses it before compiling, naming ``add.reference``."""
    op = dataclasses.replace(add, **{field: fn})
    op.check()  # a valid declaration for in-process use
    with pytest.raises(DeclarationError) as info:
        describe(op)
    assert info.value.field == field and f"add.{field}: " in str(info.value) and words in str(info.value), info.value
    project = Project(model="m", model_version="1", operator_modules=(), targets=("c",), root=None)
    with pytest.raises(DeclarationError, match=f"add.{field}: "):
        build(project, {"add": op}, tmp_path, BuildOptions(jobs=1))
    assert not list(tmp_path.iterdir())  # nothing compiled, no staging left behind


def test_a_module_level_function_is_described_by_its_qualified_name():
    assert describe(dataclasses.replace(add, reference=_double))["reference"] == f"{__name__}._double"


def test_a_dim_named_like_a_factory_parameter_names_the_collision():
    t = TensorArg("A", ("dtype",))
    op = dataclasses.replace(add, inputs=(t, dataclasses.replace(t, name="B")), outputs=(TensorArg("C", ("dtype",)),),
                             shapes=({"dtype": 64},), ranges=())
    with pytest.raises(DeclarationError) as info:
        op.check()
    assert "the factory parameter 'dtype' would receive both dim dtype and the operator dtype" in str(info.value)
    assert "rename the dim" in str(info.value.hint)


@pytest.mark.parametrize("bound", [2**31, 2**40])
def test_a_dynamic_range_past_int32_is_refused(bound):
    op = dataclasses.replace(add, ranges=(DynamicRange("N", 1, bound),))
    with pytest.raises(DeclarationError) as info:
        op.check()
    assert info.value.field == "ranges[0].max" and "at most 2147483647" in str(info.value), str(info.value)
    dataclasses.replace(add, ranges=(DynamicRange("N", 1, 2**31 - 1),)).check()


PAST_INT32 = [  # each was accepted, and would have built a kernel indexing at wrapped int32 offsets
    ("dim-2^31", dict(shapes=({"N": 2**31},)), "shapes[0].N", "N=2147483648 is over 2147483647 (2**31 - 1)"),
    ("product", dict(inputs=(TensorArg("A", ("M", "N")), TensorArg("B", ("M", "N"))),
                     outputs=(TensorArg("C", ("M", "N")),), shapes=({"M": 65536, "N": 65536},), ranges=()),
     "shapes[0]", "A ('M', 'N') is [65536, 65536] at M=65536, N=65536: 4294967296 elements, over 2147483647"),
    ("derived", dict(outputs=(TensorArg("C", ("N*2",)),), shapes=({"N": 2**30},), ranges=()),
     "shapes[0]", "C ('N*2',) is [2147483648] at N=1073741824: 2147483648 elements"),
    ("range-at-max", dict(inputs=(TensorArg("A", ("M", "N")), TensorArg("B", ("M", "N"))),
                          outputs=(TensorArg("C", ("M", "N")),), shapes=(),
                          ranges=(DynamicRange("M", 1, 2**30, {"N": 4}),)),
     "ranges[0]", "A ('M', 'N') is [1073741824, 4] at N=4, M=1073741824: 4294967296 elements"),
    ("range-fixed", dict(inputs=(TensorArg("A", ("M", "N")), TensorArg("B", ("M", "N"))),
                         outputs=(TensorArg("C", ("M", "N")),), shapes=(),
                         ranges=(DynamicRange("M", 1, 8, {"N": 2**32}),)), "ranges[0].N", "N=4294967296 is over"),
]


@pytest.mark.parametrize("name,change,field,message", PAST_INT32, ids=[c[0] for c in PAST_INT32])
def test_a_shape_past_what_int32_indexing_reaches_is_refused_naming_it(name, change, field, message):
    """A static shape with N=2**31, or dims whose product is past 2**31 - 1, was accepted (only a range's bounds
    were checked): the kernel indexes with int32, so the build made a kernel reading at wrapped offsets."""
    with pytest.raises(DeclarationError) as info:
        dataclasses.replace(add, **change).check()
    assert info.value.operator == "add" and info.value.field == field, str(info.value)
    assert message in str(info.value) and "int32" in str(info.value.hint), str(info.value)
    dataclasses.replace(add, shapes=({"N": 2**31 - 1},), ranges=()).check()  # the largest is still declared


@pytest.mark.parametrize("value", [0, -4, True, 2.5, "64", None], ids=["0", "-4", "True", "2.5", "str", "None"])
def test_a_range_fixed_size_that_is_not_a_positive_int_is_refused_naming_it(value):
    """A static shape's dims had to be positive ints; a range's ``fixed`` ones were not checked: 0, -4, True, 2.5
    and "64" were accepted (a string never matched a call's int, so the range served nothing), None raised a bare
    TypeError from int()."""
    op = dataclasses.replace(rmsnorm_cpu, shapes=(), ranges=(DynamicRange("M", 1, 8, {"N": value}),))
    with pytest.raises(DeclarationError) as info:
        op.check()
    assert info.value.field == "ranges[0].fixed.N" and "must be a positive int, got" in str(info.value), info.value
    dataclasses.replace(op, ranges=(DynamicRange("M", 1, 8, {"N": 64}),)).check()


REFUSED = [  # each was accepted (or raised a TypeError) before it was refused here
    ("keyword", dict(name="None"), "name", "'None' is a Python keyword", 'name="none_op"'),
    ("keyword-import", dict(name="import"), "name", "'import' is a Python keyword", 'name="import_op"'),
    ("trailing-newline", dict(name="add\n"), "name", "must be an identifier, got 'add\\n'", "starting with a letter"),
    ("not-a-str", dict(name=5), "name", "must be a str, got int 5", 'name="my_op"'),
    ("long", dict(name="L" * 200), "ranges[0]", "is 222 characters, over 200", "shorten the operator name"),
    ("shape-twice", dict(shapes=({"N": 64}, {"N": 64})), "shapes[1]", "repeats shapes[0]", "each shape once"),
    ("range-twice", dict(ranges=(DynamicRange("N", 1, 64),) * 2), "ranges[1]", "repeats ranges[0]", "each shape once"),
    ("dims-none", dict(inputs=(TensorArg("A", None), TensorArg("B", ("N",)))), "inputs.A.dims",
     "dims must be a tuple of dim names, got NoneType", 'TensorArg("A", ("M", "N"))'),
    ("atol-negative", dict(tolerances={"float32": Tolerance(-1e-4, 1e-4)}), "tolerances.float32.atol",
     "atol must be a finite number >= 0, got -0.0001", "fails every kernel"),
    ("rtol-nan", dict(tolerances={"C": Tolerance(0.0, float("nan"))}), "tolerances.C.rtol",
     "rtol must be a finite number >= 0, got nan", "fails every kernel"),
    ("range-fixes-its-dim", dict(ranges=(DynamicRange("N", 1, 8, {"N": 3}),)), "ranges[0].fixed.N",
     "fixed gives N = 3, the range's own dim (1..8)", "declare N=3 as a shape"),
]


@pytest.mark.parametrize("change,field,words,hint", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_field_a_release_cannot_use_is_refused_when_declared(change, field, words, hint):
    """An operator named ``None`` built, then ``register(release)`` died in torch's schema parser (``expected
    ident but found 'None'``); ``"add\\n"`` passed the name check (``$`` matches before a trailing newline);
    ``name=5`` and ``dims=None`` raised a TypeError; a negative or NaN tolerance failed every kernel at verify; a
    250-character name failed the whole build after compiling started (``File name too long``); a shape declared
    twice was compiled twice into one directory, concurrently; a range whose ``fixed`` also gave its own dim was
    accepted, the fixed value silently ignored."""
    op = dataclasses.replace(add, **{"shapes": ({"N": 64},), **change})
    with pytest.raises(DeclarationError) as info:
        op.check()
    assert info.value.field == field and words in str(info.value), str(info.value)
    assert hint in str(info.value.hint), str(info.value)
