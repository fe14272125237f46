"""The drill's load generator: KServe v2 requests from worker threads, each answer checked and recorded.

Test and benchmark tooling, outside the wheel: ``tileship drill`` (``tileship.verify.drill``)
imports it from the source checkout as ``benchmarks.drill_client`` (``tileship.extras``).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tileship.verify.drill import DrillOptions

KSERVE = {"float16": "FP16", "bfloat16": "BF16", "float32": "FP32", "float64": "FP64", "int8": "INT8", "int32": "INT32"}


HEADER_LENGTH = "inference-header-content-length"


@dataclass
class Sample:
    op: str
    spec_id: str
    dims: dict[str, int]
    dtype: str
    body: bytes
    header_length: int
    outputs: list[str]
    expected: list[Any]
    tol: tuple[float, float]
    nbytes: int


@dataclass
class Record:
    t0: float
    t1: float
    op: str
    status: int | None          # None: no response (dropped)
    ok: bool
    release: str | None = None
    path: str | None = None
    reason: str | None = None
    error: str | None = None


def encode_request(inputs: list[tuple[str, tuple[str, ...]]], args: list[Any], outputs: list[str]) -> tuple[bytes, int]:
    """A KServe v2 request with every tensor as raw bytes (binary data extension)."""
    import torch

    head: dict[str, Any] = {"inputs": [],
                            "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs]}
    blobs = []
    for (name, _), a in zip(inputs, args, strict=True):
        raw = (a.view(torch.int16) if a.dtype == torch.bfloat16 else a).contiguous().numpy().tobytes()
        head["inputs"].append({"name": name, "shape": list(a.shape),
                               "datatype": KSERVE[str(a.dtype).removeprefix("torch.")],
                               "parameters": {"binary_data_size": len(raw)}})
        blobs.append(raw)
    text = json.dumps(head, separators=(",", ":")).encode()
    return text + b"".join(blobs), len(text)


def decode_response(content: bytes, header_length: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(response JSON, output name -> CPU tensor) of a KServe v2 response (JSON or binary)."""
    import torch

    hl = int(header_length) if header_length is not None else len(content)
    head = json.loads(content[:hl])
    tensors: dict[str, Any] = {}
    offset = hl
    dtypes = {v: getattr(torch, k) for k, v in KSERVE.items()}
    for o in head.get("outputs", []):
        dt = dtypes[o["datatype"]]
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            buf = bytearray(content[offset:offset + size])
            offset += size
            raw_dt = torch.int16 if dt == torch.bfloat16 else dt
            t = torch.frombuffer(buf, dtype=raw_dt) if size else torch.empty(0, dtype=raw_dt)
            t = t.view(torch.bfloat16) if dt == torch.bfloat16 else t
        else:
            t = torch.tensor(o["data"], dtype=dt)
        tensors[o["name"]] = t.reshape(o["shape"])
    return head, tensors


def check_answer(sample: Sample, got: dict[str, Any]) -> str | None:
    """None when every output matches the expected answer within tolerance, else why not."""
    import torch

    atol, rtol = sample.tol
    for name, exp in zip(sample.outputs, sample.expected, strict=True):
        t = got.get(name)
        if t is None:
            return f"output {name} missing"
        if tuple(t.shape) != tuple(exp.shape):
            return f"output {name} has shape {tuple(t.shape)}, expected {tuple(exp.shape)}"
        o = t.double()
        if not bool(torch.isfinite(o).all()):
            return f"output {name} holds NaN/Inf"
        err = (o - exp).abs()
        bad = int((err > atol + rtol * exp.abs()).sum())
        if bad:
            return (f"output {name}: {bad} of {err.numel()} elements off (max |err| {float(err.max()):.3g}, "
                    f"atol {atol}, rtol {rtol})")
    return None


def run_client(url: str, samples: list[Sample], idx: int, stop: threading.Event, records: list[Record],
               opts: DrillOptions) -> None:
    import httpx

    i = idx
    with httpx.Client(base_url=url, timeout=opts.request_timeout_s) as client:
        while not stop.is_set():
            s = samples[i % len(samples)]
            i += opts.concurrency
            headers = {HEADER_LENGTH: str(s.header_length), "content-type": "application/octet-stream"}
            t0 = time.perf_counter()
            try:
                r = client.post(f"/v2/models/{s.op}/infer", content=s.body, headers=headers)
            except httpx.HTTPError as exc:
                records.append(Record(t0, time.perf_counter(), s.op, None, False, error=f"{type(exc).__name__}: {exc}"))
                continue
            t1 = time.perf_counter()
            if r.status_code != 200:
                records.append(Record(t0, t1, s.op, r.status_code, False, error=r.text[:300]))
                continue
            try:
                head, outs = decode_response(r.content, r.headers.get(HEADER_LENGTH))
                problem = check_answer(s, outs)
            except Exception as exc:  # an undecodable answer is a wrong answer
                head, problem = {}, f"undecodable response: {type(exc).__name__}: {exc}"
            p = head.get("parameters") or {}
            records.append(Record(t0, t1, s.op, 200, problem is None,
                                  release=p.get("tileship_release") or r.headers.get("x-tileship-release"),
                                  path=p.get("tileship_path") or r.headers.get("x-tileship-path"),
                                  reason=p.get("tileship_reason") or r.headers.get("x-tileship-reason"),
                                  error=None if problem is None else f"{s.spec_id} {s.dims}: {problem}"))
