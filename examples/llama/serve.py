"""A whole model served next to the operators: ``tileship serve RELEASE --llama CONFIG``.

The random-weight Llama decoder of ``examples.llama.model`` (seeded: a client rebuilds the same
weights with ``random_llama(config, dtype=..., seed=...)``), swapped onto the live release
with ``tileship.torchops.swap.swap``, is one more model of the server (default name ``llama``):

    input   input_ids  INT64  [-1, -1]          (batch, seq); 0 <= id < vocab, seq <= max_seq
    output  logits     model dtype  [-1, -1, vocab]

The weights are built once (``LlamaHost.template``); every release the server loads gets
its own copy swapped onto it while it is prepared off to the side (``LlamaHost.bind``, called
by ``ReleaseHolder.prepare``), so a reload that cannot swap never takes traffic, and a model
is never bound to a release other than the one it is served with: both travel in one
``Served``. In-flight requests finish on the model and release they started on.

Each request reports what its layers dispatched: every swapped layer calls its operator's
``OpRunner.call`` directly (not the torch custom op), and the decision is recorded per
request (thread-local), so counts are exact with several worker threads.

Not part of the wheel: ``tileship serve`` imports this module through ``tileship.extras`` only
when ``--llama`` is given. What the server uses: ``parse_spec``, ``LlamaHost(spec).bind``, and
the ``BoundModel`` it returns (``plan``, ``output_bytes``, ``run``, ``metadata``, ``device``, ``spec.name``,
``output``).
"""

from __future__ import annotations

import copy
import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tileship.errors import DeclarationError
from tileship.runtime.dispatch import KERNEL, REFERENCE, Decision, Release
from tileship.serve import protocol
from tileship.serve.protocol import BadRequest

INPUT, OUTPUT = "input_ids", "logits"
#: preset -> LlamaConfig fields, dtype and seed. ``tiny`` runs on a laptop CPU (hidden 1024
#: matches the CPU catalog's rmsnorm_cpu); ``7b-2layer`` is Llama-2-7B's sizes with 2 layers,
#: the shapes the CUDA catalog declares.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"vocab": 64, "hidden": 1024, "heads": 8, "intermediate": 1536, "layers": 1, "max_seq": 64,
             "dtype": "float32", "seed": 0},
    "7b-2layer": {"vocab": 32000, "hidden": 4096, "heads": 32, "intermediate": 11008, "layers": 2, "max_seq": 4096,
                  "dtype": "float16", "seed": 0},
}
_KEYS = {"vocab", "hidden", "heads", "intermediate", "layers", "max_seq", "eps", "dtype", "seed", "name", "names"}
_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class LlamaSpec:
    """What to build: sizes, dtype, seed, the served model name and swap's ``names`` overrides."""

    vocab: int
    hidden: int
    heads: int
    intermediate: int
    layers: int
    max_seq: int = 4096
    eps: float = 1e-6
    dtype: str = "float32"
    seed: int = 0
    name: str = "llama"
    names: tuple[tuple[str, str], ...] = ()

    def config(self) -> Any:
        from examples.llama.model import LlamaConfig

        return LlamaConfig(vocab_size=self.vocab, hidden=self.hidden, n_layers=self.layers, n_heads=self.heads,
                           intermediate=self.intermediate, max_seq=self.max_seq, eps=self.eps)

    def to_json(self) -> dict[str, Any]:
        return {"vocab": self.vocab, "hidden": self.hidden, "heads": self.heads, "intermediate": self.intermediate,
                "layers": self.layers,
                "max_seq": self.max_seq, "eps": self.eps, "dtype": self.dtype, "seed": self.seed,
                "names": dict(self.names)}


def parse_spec(text: str) -> LlamaSpec:
    """``--llama`` argument: a preset name (``tiny``, ``7b-2layer``) or a JSON file holding the
    preset keys (vocab, hidden, heads, intermediate, layers; optional max_seq, eps, dtype,
    seed, name, names; a ``preset`` key starts from that preset). Raises DeclarationError
    naming the bad key or value."""
    if text in PRESETS:
        return _spec(dict(PRESETS[text]), f"preset {text}")
    path = Path(text)
    if not path.is_file():
        raise DeclarationError(f"{text!r} is neither a preset ({', '.join(PRESETS)}) nor a JSON file", field="--llama")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DeclarationError(f"{path}: not readable JSON ({exc})", field="--llama") from None
    if not isinstance(raw, dict):
        raise DeclarationError(f"{path}: must hold a JSON object, got {type(raw).__name__}", field="--llama")
    base = raw.pop("preset", None)
    if base is not None and base not in PRESETS:
        raise DeclarationError(f"{path}: unknown preset {base!r} (presets: {', '.join(PRESETS)})", field="--llama")
    return _spec({**(PRESETS[base] if base else {}), **raw}, str(path))


def _spec(raw: dict[str, Any], where: str) -> LlamaSpec:
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise DeclarationError(f"{where}: unknown keys {unknown} (known: {', '.join(sorted(_KEYS))})", field="--llama")
    missing = [k for k in ("vocab", "hidden", "heads", "intermediate", "layers") if k not in raw]
    if missing:
        raise DeclarationError(f"{where}: missing {', '.join(missing)}", field="--llama")
    for k in ("vocab", "hidden", "heads", "intermediate", "layers", "max_seq", "seed"):
        if k in raw and (not isinstance(raw[k], int) or isinstance(raw[k], bool)):
            raise DeclarationError(f"{where}: {k} must be an integer, got {raw[k]!r}", field="--llama")
    if raw.get("dtype", "float32") not in _DTYPES:
        raise DeclarationError(f"{where}: dtype must be one of {', '.join(_DTYPES)}, got {raw['dtype']!r}",
                               field="--llama")
    names = raw.pop("names", {}) or {}
    if not isinstance(names, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in names.items()):
        raise DeclarationError(f"{where}: names must map a layer kind to an operator name, e.g. {{\"rmsnorm\": "
                               f"\"rmsnorm_cpu\"}}", field="--llama")
    name = raw.get("name", "llama")
    if not isinstance(name, str) or not name or "/" in name:
        raise DeclarationError(f"{where}: name must be a non-empty string without '/', got {name!r}", field="--llama")
    spec = LlamaSpec(**{**raw, "names": tuple(sorted(names.items()))})
    try:
        spec.config()  # LlamaConfig's own checks: sizes >= 1, heads divide hidden, even head_dim
    except ValueError as exc:
        raise DeclarationError(f"{where}: {exc}", field="--llama") from None
    return spec


class _Recorder(threading.local):
    calls: list[tuple[str, Decision]] | None = None


class _Recorded:
    """Stands in for a swapped layer's custom op: calls the runner, records the decision."""

    def __init__(self, module: str, runner: Any, recorder: _Recorder) -> None:
        self.module, self.runner, self.recorder = module, runner, recorder

    def __call__(self, *args: Any) -> Any:
        out, decision = self.runner.call(*args)
        calls = self.recorder.calls
        if calls is not None:
            calls.append((self.module, decision))
        return out if out.is_contiguous() else out.contiguous()  # the layers .view() the output

    def __repr__(self) -> str:
        return f"{self.runner.name} (recorded)"


@dataclass
class BoundModel:
    """The model swapped onto one release: what requests for ``spec.name`` run."""

    spec: LlamaSpec
    model: Any
    release_id: str
    kernel_revision: str
    device: str
    swap_report: Any
    recorder: _Recorder = field(default_factory=_Recorder)
    #: the name of the one output, ``logits``
    output: ClassVar[str] = OUTPUT

    @property
    def kept(self) -> dict[str, str]:
        return dict(self.swap_report.kept)

    def summary(self) -> str:
        r = self.swap_report
        return f"{len(r.replaced)} of {len(r.records)} candidate layers on release kernels"

    def metadata(self) -> dict[str, Any]:
        """KServe model metadata; ``parameters.config`` is what a client needs to rebuild the weights."""
        dt = protocol.KSERVE[self.spec.dtype]
        return {
            "name": self.spec.name, "versions": [self.release_id], "platform": "tileship-llama",
            "inputs": [{"name": INPUT, "datatype": "INT64", "shape": [-1, -1]}],
            "outputs": [{"name": OUTPUT, "datatype": dt, "shape": [-1, -1, self.spec.vocab]}],
            "parameters": {"device": self.device, "kernel_revision": self.kernel_revision,
                           "config": json.dumps(self.spec.to_json()),
                           "swap": self.summary(),
                           "layers": json.dumps({r.module: ("kernel " + (r.operator or "")) if r.replaced else
                                                                         f"pytorch: {r.reason}"
                                                                         for r in self.swap_report.records}),
                           "strict_shapes": False},
        }

    def plan(self, req: protocol.InferRequest) -> tuple[protocol.InputTensor, bool]:
        """Check the request's header (on the event loop); returns the input and whether
        ``logits`` goes back as binary. Raises BadRequest (400) naming the problem."""
        m = self.spec.name
        names = [i.name for i in req.inputs]
        if names != [INPUT]:
            raise BadRequest(400,
                             f"model {m} takes one input, {INPUT} (INT64, shape [batch, seq]); got {', '.join(names)}")
        inp = req.inputs[0]
        if inp.datatype != "INT64":
            raise BadRequest(400, f"wrong datatype: input {INPUT} is {inp.datatype}; model {m} accepts INT64 token ids")
        if len(inp.shape) != 2:
            raise BadRequest(400,
                             f"wrong rank: input {INPUT} has shape {list(inp.shape)} (rank {len(inp.shape)}); model "
                             f"{m} takes [batch, seq] (rank 2)")
        if 0 in inp.shape:
            raise BadRequest(400,
                             f"wrong shape: input {INPUT} has shape {list(inp.shape)}; batch and seq must be at least "
                             "1")
        if inp.shape[1] > self.spec.max_seq:
            raise BadRequest(400,
                             f"wrong shape: input {INPUT} has seq {inp.shape[1]}; model {m} takes at most "
                             f"max_seq={self.spec.max_seq} tokens")
        binary = req.binary_output
        for name, b in req.outputs:
            if name != OUTPUT:
                raise BadRequest(400, f"unknown output {name!r}: model {m} produces {OUTPUT}")
            binary = req.binary_output if b is None else b
        return inp, binary

    def output_bytes(self, plan: tuple[protocol.InputTensor, bool]) -> dict[str, int]:
        """What the call of ``plan`` (from ``plan``) will allocate, by the server's output limit (``--max-output-mib``,
        checked before it runs): ``logits`` (batch x seq x vocab) and the forward's widest activation (batch x seq x
        the larger of hidden and intermediate), in the model's dtype. Without it a request of many short sequences
        was run whole: a 64 MiB body of token ids made tens of GiB. (The attention is an operator's call: its
        scores are left to the kernel, which need not make them whole.)"""
        import torch

        batch, seq = plan[0].shape
        item = getattr(torch, self.spec.dtype).itemsize
        widest = max(self.spec.hidden, self.spec.intermediate)
        return {OUTPUT: batch * seq * self.spec.vocab * item, "activation": batch * seq * widest * item}

    def run(self, inp: protocol.InputTensor) -> tuple[Any, Decision, dict[str, Any]]:
        """On a worker thread: token ids -> logits (on the model's device). Raises BadRequest
        for a token id outside [0, vocab); what the layers raise otherwise."""
        import torch

        ids = protocol.to_tensor(inp, "cpu")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.spec.vocab:
            bad = lo if lo < 0 else hi
            raise BadRequest(400,
                             f"token id out of range: input {INPUT} holds {bad}; model {self.spec.name} has vocab "
                             f"{self.spec.vocab} "
                             f"(ids 0..{self.spec.vocab - 1})")
        ids = ids.to(self.device)
        calls: list[tuple[str, Decision]] = []
        self.recorder.calls = calls
        try:
            with torch.inference_mode():
                logits = self.model(ids)
        finally:
            self.recorder.calls = None
        return logits, *_dispatch(calls, self.kept)


def _dispatch(calls: list[tuple[str, Decision]], kept: dict[str, str]) -> tuple[Decision, dict[str, Any]]:
    """(the request's overall decision, its ``tileship_*`` dispatch parameters)."""
    per_layer: dict[str, str] = {}
    reasons: Counter[str] = Counter()
    kernel = 0
    for module, d in calls:
        if d.path == KERNEL:
            kernel += 1
            per_layer[module] = KERNEL
        else:
            reasons[d.reason] += 1
            per_layer[module] = f"{d.path}:{d.reason}"
    for module in kept:
        per_layer[module] = "pytorch"
    ref = sum(reasons.values())
    if ref == 0 and kernel:
        decision = Decision(KERNEL, KERNEL)
    elif kernel == 0:  # a bounded label set for metrics: the reference reasons, or "pytorch" when no layer was swapped
        decision = Decision(REFERENCE, "+".join(sorted(reasons)) or "pytorch")
    else:
        decision = Decision("mixed", "+".join(sorted(reasons)))
    params = {"tileship_kernel_calls": kernel, "tileship_reference_calls": ref, "tileship_pytorch_layers": len(kept),
              "tileship_dispatch": json.dumps(dict(sorted(per_layer.items())), separators=(",", ":"))}
    return decision, params


class LlamaHost:
    """Builds the weights once and binds a swapped copy to each release the server loads."""

    def __init__(self, spec: LlamaSpec) -> None:
        self.spec = spec
        self._template: Any = None
        self._lock = threading.Lock()

    def template(self, device: str) -> Any:
        from examples.llama.model import random_llama

        with self._lock:
            if self._template is None or str(self._template.rope_cos.device.type) != device:
                import torch

                self._template = random_llama(self.spec.config(), dtype=getattr(torch, self.spec.dtype), device=device,
                                              seed=self.spec.seed)
            return self._template

    def bind(self, release: Release, devices: dict[str, str]) -> dict[str, BoundModel]:
        """A fresh copy of the model swapped onto ``release`` (device: CUDA when any operator
        serves there). Raises what ``swap`` raises (DeclarationError for an operator with the
        wrong signature) and out-of-memory errors: the release then does not take traffic."""
        from tileship.torchops.swap import KernelAttention, KernelLinear, KernelRMSNorm, swap

        device = "cuda" if "cuda" in devices.values() else "cpu"
        model = copy.deepcopy(self.template(device))
        report = swap(model, release, names=dict(self.spec.names) or None)
        recorder = _Recorder()
        for path, module in model.named_modules():
            if isinstance(module, (KernelLinear, KernelRMSNorm, KernelAttention)):
                module.op = _Recorded(path, release.ops[report.record(path).operator or ""], recorder)
        bound = BoundModel(self.spec, model, release.release_id, release.kernel_revision, device, report, recorder)
        return {self.spec.name: bound}


__all__ = ["INPUT", "OUTPUT", "PRESETS", "BoundModel", "LlamaHost", "LlamaSpec", "parse_spec"]
