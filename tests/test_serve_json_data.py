"""JSON tensor data at C speed (``serve.json_data``) gives exactly what ``torch.tensor`` gives over
the same Python values, for every datatype, flat or nested, and refuses what it refused and what it would
change (a fraction in an integer input, a number other than 0 or 1 in a BOOL one); JSON
outputs written through orjson's NumPy path are the same bytes as through ``tolist``."""

from __future__ import annotations

import array
import json
import math

import orjson
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tileship.serve.encoding import DATATYPES, encode_response
from tileship.serve.json_data import to_torch, values
from tileship.serve.validate import BadRequest

NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), st.integers(-(2**70), 2**70),
                    st.booleans(), st.integers(-300, 300))


def _torch_or_error(data: list, dtype: torch.dtype) -> torch.Tensor | None:
    """``torch.tensor``'s answer, or None where it refuses ``data`` or would change a value: a fraction in an integer
    dtype (it truncates), a number other than 0 or 1 in bool (it makes it true), which the server refuses."""
    numbers = [x for x in data if isinstance(x, (int, float))]
    if dtype == torch.bool and any(x != 0 and x != 1 for x in numbers):
        return None
    if not dtype.is_floating_point and dtype != torch.bool and any(
            type(x) is float and not x.is_integer() for x in numbers):
        return None
    try:
        return torch.tensor(data, dtype=dtype)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return None


_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
         torch.float64: torch.int64, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and values, bit for bit (-0.0 is not 0.0); NaN where the other has NaN."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return bool(torch.equal(a, b))
    nan, nan_b = a.float().isnan(), b.float().isnan()  # through float32: torch has no isnan of the 8-bit floats
    return bool(torch.equal(nan, nan_b) and torch.equal(a[~nan].view(_BITS[a.dtype]), b[~nan].view(_BITS[a.dtype])))


@pytest.mark.parametrize("kserve", sorted(DATATYPES))
@settings(max_examples=120, deadline=None)
@given(data=st.lists(NUMBERS, max_size=24))
def test_flat_data_matches_torch_tensor_or_is_refused_as_before(kserve, data):
    dtype = getattr(torch, DATATYPES[kserve])
    want = _torch_or_error(data, dtype)
    try:
        got = to_torch(values(data, "X", kserve, [len(data)], 8), dtype)
    except BadRequest as exc:  # a value the datatype would hold as another one
        assert exc.status == 400 and "does not hold" in exc.message, exc.message
        got = None
    except (TypeError, ValueError, RuntimeError, OverflowError):
        got = None
    if want is None:
        assert got is None, f"{kserve}: accepted {data!r} that torch.tensor refuses or changes"
    else:
        assert got is not None and _same(got, want), (kserve, data, got, want)


def test_typical_float_data_takes_the_array_and_odd_data_the_general_path():
    assert isinstance(values([1.0, 2, True], "X", "FP32", [3], 8), array.array)
    assert isinstance(values([1, 2, 3], "X", "INT32", [3], 8), array.array)
    assert values([2.0], "X", "INT32", [1], 8) == [2.0]  # a whole number as a float: torch.tensor converts it
    assert values([[1.0, 2.0], [3.0, 4.0]], "X", "FP32", [2, 2], 8) == [1.0, 2.0, 3.0, 4.0]
    assert values([300], "X", "INT8", [1], 8) == [300]  # out of the array's range: torch decides
    t = to_torch(values([0.1, 65504.0, 1e-8], "X", "FP16", [3], 8), torch.float16)
    assert torch.equal(t, torch.tensor([0.1, 65504.0, 1e-8], dtype=torch.float16))


@pytest.mark.parametrize("data,shape,words", [
    ([1.0, 2.0], [3], "byte size mismatch: input X has shape [3] (3 elements) but 'data' holds 2"),
    ({"a": 1}, [1], "'data' must be a list"),
    ([[[[1.0]]]], [1], "nests deeper than 3 levels"),
    ([1.5], [1], "INT32: 'data' does not hold INT32 values (1.5 is not a whole number)"),
    ([[1, 2.25]], [2], "INT32: 'data' does not hold INT32 values (2.25 is not a whole number)"),
    ([True, 2], [2], "BOOL: 'data' does not hold BOOL values (2 is neither true nor false)"),
    ([[0.0, -1.0]], [2], "BOOL: 'data' does not hold BOOL values (-1.0 is neither true nor false)"),
    ([], [2, 0], None),
])
def test_bad_data_is_a_400_naming_the_input(data, shape, words):
    if words is None:
        assert to_torch(values(data, "X", "FP32", shape, 3), torch.float32).numel() == 0
        return
    kserve = words.split(":")[0] if words.split(":")[0] in DATATYPES else "FP32"
    with pytest.raises(BadRequest) as err:
        values(data, "X", kserve, shape, 3)
    assert err.value.status == 400 and words.removeprefix(f"{kserve}: ") in err.value.message, err.value.message


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
                                   torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool])
def test_json_outputs_are_the_bytes_tolist_gives(dtype):
    g = torch.Generator().manual_seed(0)
    t = (torch.randn(3, 5, generator=g) * 100).to(dtype)
    if dtype.is_floating_point:
        t[0, 0] = -0.0
        t[0, 1] = torch.finfo(dtype).max
        t[0, 2] = torch.finfo(dtype).tiny
    enc = encode_response(model="m", version="1", request_id=None, parameters={}, outputs=[("Y", t, False)])
    legacy = orjson.dumps({"model_name": "m", "model_version": "1", "parameters": {}, "outputs": [
        {"name": "Y", "datatype": enc_dt(dtype), "shape": [3, 5], "data": t.reshape(-1).tolist()}]})
    assert enc.parts == [legacy]


def test_nonfinite_json_outputs_keep_their_bare_tokens():
    t = torch.tensor([1.0, math.nan, math.inf])
    enc = encode_response(model="m", version="1", request_id=None, parameters={}, outputs=[("Y", t, False)],
                          allow_nonfinite=True)
    assert b"[1.0,NaN,Infinity]" in enc.parts[0]
    assert json.loads(enc.parts[0])["outputs"][0]["data"][0] == 1.0
    with pytest.raises(BadRequest) as err:
        encode_response(model="m", version="1", request_id=None, parameters={}, outputs=[("Y", t, False)])
    assert err.value.status == 422


def enc_dt(dtype: torch.dtype) -> str:
    return {v: k for k, v in DATATYPES.items()}[str(dtype).removeprefix("torch.")]
