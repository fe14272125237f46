"""The ``data`` of a JSON tensor, from the parsed request to a torch tensor, at C speed where it can be.

A flat ``data`` list of numbers (what clients send) becomes a typed ``array.array`` while the
request is parsed: one C loop that also checks every element is a number of the datatype's kind,
instead of a Python scan for nested lists and then ``torch.tensor`` over Python objects (on the
CPU machine, 2 x 4096 floats: about 0.35 ms against 2 ms). Anything else (nested lists, values the
array refuses, such as a float in an INT32 input or an int out of INT8's range) takes the general
path as before: ``validate.flatten``, then ``torch.tensor``, with its errors. Both paths give the
same values: an array holds FP32 as C floats (the conversion ``torch.tensor`` makes) and FP16/BF16
as doubles, converted by torch as ``torch.tensor`` converts them.

Where ``torch.tensor`` would change a value rather than refuse it, the request is refused (400, as Triton
refuses it): a number with a fraction in an integer input (it truncates 1.5 to 1), anything but true/false
or 0/1 in a BOOL one (it makes 2, or 0.5, true). A whole number written as a float (``2.0``) is taken.
"""

from __future__ import annotations

import array
import math
from typing import Any

from tileship.serve.validate import BadRequest, flatten, short

#: KServe datatype -> the array type code that holds its values exactly as torch will read them
_CODES = {"FP32": "f", "FP64": "d", "FP16": "d", "BF16": "d", "INT8": "b", "UINT8": "B", "INT16": "h",
          "INT32": "i", "INT64": "q", "BOOL": "B", "FP8_E4M3": "d", "FP8_E5M2": "d"}
#: integer datatypes: a value with a fraction is refused, not truncated
_WHOLE = frozenset(("INT8", "UINT8", "INT16", "INT32", "INT64"))
#: array type code -> the torch dtype name of its items
_ITEM = {"f": "float32", "d": "float64", "b": "int8", "B": "uint8", "h": "int16", "i": "int32", "q": "int64"}


def values(data: Any, name: str, datatype: str, shape: list[int], max_depth: int) -> array.array[Any] | list[Any]:
    """The leaves of input ``name``'s JSON ``data``: a typed array when ``data`` is a flat list the
    datatype's array code takes, else the flattened list (nesting at most ``max_depth``). Raises
    BadRequest 400 when ``data`` is not a list, nests too deep, or does not hold ``shape``'s count of values."""
    code = _CODES.get(datatype)
    leaves: array.array[Any] | list[Any] | None = None
    if code is not None and type(data) is list:
        try:
            leaves = array.array(code, data)
        except (TypeError, OverflowError, ValueError):
            leaves = None  # nested, or a value of another kind: the general path decides
    if leaves is None:
        leaves = flatten(data, name, max_depth)
    count = math.prod(shape)
    if len(leaves) != count:
        raise BadRequest(400, f"byte size mismatch: input {name} has shape {shape} ({count} elements) but 'data' "
                              f"holds {len(leaves)}")
    if datatype == "BOOL" or (datatype in _WHOLE and not isinstance(leaves, array.array)):
        _check_exact(leaves, name, datatype)
    return leaves


def _check_exact(leaves: array.array[Any] | list[Any], name: str, datatype: str) -> None:
    """BadRequest 400 for a number ``datatype`` would hold as another value: a fraction in an integer input
    (an array of an integer code holds whole numbers only), anything but 0/1 in a BOOL one. Values that are no
    numbers are left to ``to_torch``, which refuses them."""
    if datatype == "BOOL":
        if isinstance(leaves, array.array):  # code "B": 0..255
            bad = next((x for x in leaves if x > 1), None) if leaves and max(leaves) > 1 else None
        else:
            bad = next((x for x in leaves if isinstance(x, (int, float)) and x != 0 and x != 1), None)
        if bad is not None:
            raise BadRequest(400, f"wrong dtype: input {name}: 'data' does not hold BOOL values ({short(bad)} is "
                                  "neither true nor false)")
        return
    bad = next((x for x in leaves if type(x) is float and not x.is_integer()), None)
    if bad is not None:
        raise BadRequest(400, f"wrong dtype: input {name}: 'data' does not hold {datatype} values ({short(bad)} is "
                              "not a whole number)")


def to_torch(leaves: array.array[Any] | list[Any], dtype: Any) -> Any:
    """A flat torch tensor of ``dtype`` holding ``leaves`` (from ``values``); a list goes through
    ``torch.tensor`` (TypeError, ValueError, RuntimeError or OverflowError for values it refuses)."""
    import torch

    if not isinstance(leaves, array.array):
        return torch.tensor(leaves, dtype=dtype)
    item = getattr(torch, _ITEM[leaves.typecode])
    t = torch.frombuffer(leaves, dtype=item) if len(leaves) else torch.empty(0, dtype=item)
    return t if item == dtype else t.to(dtype)
