"""Interesting hostile requests for the server, as regression cases (tests/test_serve_limits.py).

Each case: (id, method, path, body bytes, headers, expected status, words the error must hold).
Every one must get a 4xx with a short message naming the problem, never a 5xx, against the
fake server of test_serve_limits (models ``add`` X[N] + Y[N] -> Z[N] and ``outer`` X[N], W[M] -> Y[N, M]).
"""

from __future__ import annotations

import json
from typing import Any

JSON = {"content-type": "application/json"}


def _doc(inputs: list[dict[str, Any]], **extra: Any) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def _x(shape: Any = (4,), data: Any = None, name: str = "X", dt: str = "FP32") -> dict[str, Any]:
    n = 1
    for d in shape if isinstance(shape, (list, tuple)) else ():
        n *= d if isinstance(d, int) else 1
    return {"name": name, "shape": list(shape) if isinstance(shape, (list, tuple)) else shape, "datatype": dt,
            "data": data if data is not None else [1.0] * min(n, 16)}


def _bin(header: dict[str, Any], blob: bytes, claimed: str | None = None) -> tuple[bytes, dict[str, str]]:
    h = json.dumps(header).encode()
    return h + blob, {"inference-header-content-length": str(len(h)) if claimed is None else claimed}


_ADD = "/v2/models/add/infer"
_OUTER = "/v2/models/outer/infer"
_Y = _x(name="Y")
_HUGE = "1" + "0" * 5000  # past Python's int-str limit (4300 digits)
_BIN_X = {"name": "X", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}
_BIN_Y = {**_BIN_X, "name": "Y"}
#: "²" as the server reads header bytes (latin-1): a digit to str.isdigit(), not to int()
_LATIN1_TWO: dict[str, Any] = {"inference-header-content-length": b"\xb2"}

CASES: list[tuple[str, str, str, bytes, dict[str, str], int, str]] = [
    ("huge-int-in-shape", "POST", _ADD,
     b'{"inputs":[{"name":"X","shape":[' + _HUGE.encode() + b'],"datatype":"FP32","data":[1]}]}',
     JSON, 400, "malformed JSON"),
    ("huge-int-in-data", "POST", _ADD,
     _doc([_x(data=[1, 2, 3, 4]), _Y]).replace(b"[1, 2, 3, 4]", f"[1, 2, 3, {_HUGE}]".encode()),
     JSON, 400, "malformed JSON"),
    ("big-int-in-shape", "POST", _ADD, _doc([_x(shape=[2 ** 63]), _Y]), JSON, 413, "input X: shape[0] is"),
    ("u64-int-in-data", "POST", _ADD, _doc([_x(dt="INT32", data=[2 ** 64 - 1, 1, 1, 1]),
                                            _x(name="Y", dt="INT32", data=[1] * 4)]),
     JSON, 400, "input X"),
    ("deep-nesting", "POST", _ADD,
     b'{"inputs":[{"name":"X","shape":[1],"datatype":"FP32","data":' + b"[" * 100_000 + b"]" * 100_000 + b"}]}",
     JSON, 400, "malformed JSON"),
    ("deep-data", "POST", _ADD, _doc([_x(shape=[1], data=json.loads("[" * 500 + "1" + "]" * 500)), _Y]), JSON, 400,
     "nests deeper than 16 levels"),
    ("deep-parameters", "POST", _ADD, b'{"parameters":{"a":' + b'{"a":' * 2000 + b"1" + b"}" * 2001 + b',"inputs":[]}',
     JSON, 400, "malformed JSON"),
    ("nan-token", "POST", _ADD, b'{"inputs":[{"name":"X","shape":[2],"datatype":"FP32","data":[NaN,1]},'
     b'{"name":"Y","shape":[2],"datatype":"FP32","data":[1,1]}]}', JSON, 400, "bare NaN/Infinity tokens"),
    ("infinity-token", "POST", _ADD, b'{"inputs":[{"name":"X","shape":[2],"datatype":"FP32","data":[-Infinity,1]},'
     b'{"name":"Y","shape":[2],"datatype":"FP32","data":[1,1]}]}', JSON, 400, "parameters.allow_nonfinite"),
    ("nan-token-deep", "POST", _ADD, b'{"x":NaN,"inputs":' + b"[" * 100_000 + b"]" * 100_000 + b"}", JSON, 400,
     "malformed JSON"),
    ("nan-token-huge-int", "POST", _ADD,
     b'{"x":NaN,"inputs":[{"name":"X","shape":[' + _HUGE.encode() + b'],"datatype":"FP32","data":[1]}],'
     b'"parameters":{"allow_nonfinite":true}}', JSON, 400, "input X"),
    ("allow-nonfinite-not-bool", "POST", _ADD, _doc([_x(), _Y], parameters={"allow_nonfinite": "yes"}), JSON, 400,
     "parameters.allow_nonfinite must be true or false"),
    ("content-type-text", "POST", _ADD, _doc([_x(), _Y]), {"content-type": "text/plain"}, 415,
     "Content-Type 'text/plain'"),
    ("content-type-form", "POST", _ADD, _doc([_x(), _Y]), {"content-type": "application/x-www-form-urlencoded"}, 415,
     "send application/json"),
    ("content-type-json-on-binary-ok-but-lying", "POST", _ADD,
     *_bin({"inputs": [_BIN_X, _BIN_Y]}, b"\0" * 32, claimed="5"), 400,
     "malformed JSON"),
    ("negative-shape", "POST", _ADD, _doc([_x(shape=[-4], data=[]), _Y]), JSON, 400, "negative dimension"),
    ("overflowing-shape", "POST", _ADD, _doc([_x(shape=[2 ** 40, 2 ** 40], data=[]), _Y]), JSON, 413,
     "elements; the limit is"),
    ("too-many-dims", "POST", _ADD, _doc([_x(shape=[1] * 9, data=[1]), _Y]), JSON, 400, "has 9 dims; the limit is 8"),
    ("float-dim", "POST", _ADD, _doc([_x(shape=[4.0]), _Y]), JSON, 400, "shape[0] is 4.0"),
    ("bool-dim", "POST", _ADD, _doc([_x(shape=[True]), _Y]), JSON, 400, "shape[0] is True"),
    ("shape-not-list", "POST", _ADD, _doc([_x(shape="4"), _Y]), JSON, 400, "'shape' must be a list"),
    ("huge-declared-output", "POST", _OUTER,
     _doc([_x(shape=[1 << 17], data=[0.0] * (1 << 17)), _x(name="W", shape=[1 << 17], data=[0.0] * (1 << 17))]),
     JSON, 413, "would produce 68719476736 bytes of outputs"),
    ("data-longer-than-shape", "POST", _ADD, _doc([_x(shape=[2], data=[1, 2, 3]),
                                                   _x(name="Y", shape=[2], data=[1, 2])]), JSON, 400,
     "has shape [2] (2 elements) but 'data' holds 3"),
    ("data-shorter-than-shape", "POST", _ADD, _doc([_x(shape=[5000], data=[1]), _Y]), JSON, 400, "but 'data' holds 1"),
    ("data-strings", "POST", _ADD, _doc([_x(shape=[2], data=["a", "b"]), _x(name="Y", shape=[2], data=[1, 2])]), JSON,
     400, "wrong dtype"),
    ("data-objects", "POST", _ADD, _doc([_x(shape=[2], data=[{}, {}]), _x(name="Y", shape=[2], data=[1, 2])]), JSON,
     400, "wrong dtype"),
    ("data-null", "POST", _ADD, _doc([_x(shape=[2], data=[None, 1]), _x(name="Y", shape=[2], data=[1, 2])]), JSON, 400,
     "wrong dtype"),
    ("binary-header-longer-than-body", "POST", _ADD, *_bin({"inputs": [_BIN_X, _BIN_Y]}, b"\0" * 32, claimed="100000"),
     400, "Inference-Header-Content-Length is 100000"),
    ("binary-header-negative", "POST", _ADD, *_bin({"inputs": [_BIN_X, _BIN_Y]}, b"\0" * 32, claimed="-5"), 400,
     "must be an integer >= 0"),
    ("binary-header-huge", "POST", _ADD, *_bin({"inputs": [_BIN_X, _BIN_Y]}, b"\0" * 32, claimed="9" * 5000), 400,
     "must be an integer >= 0"),
    ("binary-size-lies", "POST", _ADD, *_bin({"inputs": [{**_BIN_X, "parameters": {"binary_data_size": 10 ** 30}},
                                                         _BIN_Y]}, b"\0" * 32),
     400, "binary_data_size"),
    ("binary-size-negative", "POST", _ADD, *_bin({"inputs": [{**_BIN_X, "parameters": {"binary_data_size": -16}},
                                                             _BIN_Y]}, b"\0" * 32),
     400, "binary_data_size must be a non-negative integer"),
    ("binary-short", "POST", _ADD, *_bin({"inputs": [_BIN_X, _BIN_Y]}, b"\0" * 17), 400, "byte size mismatch"),
    ("binary-nan-json-out", "POST", _ADD, *_bin({"inputs": [_BIN_X, _BIN_Y]}, b"\x00\x00\xc0\x7f" * 8), 422,
     "output Z holds NaN or Infinity"),
    ("invalid-utf8", "POST", _ADD, b'{"inputs":"\xff\xfe"}', JSON, 400, "malformed JSON"),
    ("top-level-array", "POST", _ADD, b"[1,2,3]", JSON, 400, "must be a JSON object"),
    ("empty-body", "POST", _ADD, b"", JSON, 400, "malformed JSON"),
    ("huge-input-name", "POST", _ADD, _doc([_x(name="N" * 100_000), _Y]), JSON, 400,
     "inputs[0].name is 100000 characters long"),
    ("huge-datatype", "POST", _ADD, _doc([_x(dt="F" * 100_000), _Y]), JSON, 400, "unsupported datatype 'FFFF"),
    ("duplicate-output", "POST", _ADD, _doc([_x(), _Y], outputs=[{"name": "Z"}, {"name": "Z", "parameters": {
        "binary_data": True}}]), JSON, 400, "output Z is requested twice"),
    ("content-encoding-unknown", "POST", _ADD, _doc([_x(), _Y]), {**JSON, "content-encoding": "br"}, 415,
     "Content-Encoding 'br' is not supported"),
    ("content-encoding-not-gzip", "POST", _ADD, _doc([_x(), _Y]), {**JSON, "content-encoding": "gzip"}, 400,
     "the body is not valid gzip data"),
    ("huge-output-name", "POST", _ADD, _doc([_x(), _Y], outputs=[{"name": "Q" * 100_000}]), JSON, 400,
     "unknown output 'QQQ"),
    ("huge-model-name", "POST", "/v2/models/" + "m" * 20_000 + "/infer", _doc([_x(), _Y]), JSON, 404,
     "unknown model 'mmm"),
    ("huge-binary-flag", "POST", _ADD, _doc([_x(), _Y], parameters={"binary_data_output": "x" * 100_000}), JSON, 400,
     "parameters.binary_data_output must be true or false"),
    ("shared-memory", "POST", _ADD, _doc([_x(), _Y], parameters={"shared_memory_region": "r"}), JSON, 400,
     "shared-memory"),
    ("id-not-string", "POST", _ADD, _doc([_x(), _Y], id=5), JSON, 400, "'id' must be a string"),
    ("unknown-version", "POST", "/v2/models/add/versions/" + "9" * 5000 + "/infer", _doc([_x(), _Y]), JSON, 404,
     "unknown version"),
    # str.isdigit() takes superscripts and other scripts' digits, which int() refuses: a 500 before
    ("header-length-superscript", "POST", _ADD, _bin({"inputs": [_BIN_X, _BIN_Y]}, b"\0" * 32)[0],
     _LATIN1_TWO, 400, "Inference-Header-Content-Length"),
    ("header-length-digit-then-superscript", "POST", _ADD, _bin({"inputs": [_BIN_X, _BIN_Y]}, b"\0" * 32)[0],
     {"inference-header-content-length": b"1\xb3"}, 400, "Inference-Header-Content-Length"),  # type: ignore[dict-item]
    ("classification-on-a-huge-output-name", "POST", _ADD,
     _doc([_x(), _Y], outputs=[{"name": "Z" * 100_000, "parameters": {"classification": 1}}]), JSON, 400,
     "classification extension"),
    ("huge-unknown-route", "GET", "/v2/" + "p" * 20_000, b"", {}, 404, "Not Found"),
    ("canary-huge-unknown-field", "POST", "/v2/tileship/canary",
     json.dumps({"release": "somewhere", "Z" * 50_000: 1}).encode(), JSON, 400, "unknown field"),
    ("canary-huge-release", "POST", "/v2/tileship/canary", json.dumps({"release": "/" + "r" * 50_000}).encode(),
     JSON, 400, "at most 4096 characters"),
    ("unload-body-too-large", "POST", "/v2/repository/models/add/unload", b" " * (65 << 10), JSON, 413,
     "the limit is 65536 bytes (a control request's limit)"),
]
