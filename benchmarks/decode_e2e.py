"""On the GPU host: a Llama-3-8B-shaped decoder with a real KV cache, PyTorch vs tileship (fp16 and W4A16).

The model (self-contained here, random weights of the real sizes, seeded, scale --init-scale):
hidden 4096, --layers decoder layers (default 32), 32 query / 8 KV heads of 128 (GQA),
qkv fused 4096->6144, o 4096->4096, gate+up fused 4096->28672, down 14336->4096, vocab
128256 (lm_head 4096->128256), RMSNorm eps --rms-eps (1e-5), RoPE theta 500000, --dtype (fp16).
KV cache: per layer contiguous k/v [B, S_cap, 8, 128] and ``lengths`` int32 [B].

    prefill   one eager forward over the prompt [B, P], P = S_cap - --decode-room, causal SDPA,
              filling the cache; the last position's logits give the first token
    decode    per step, for the B sequences: embed -> per layer: rmsnorm, qkv, RoPE at position
              lengths[b], k/v written into the cache at lengths[b] (index_copy_, no host sync),
              attention over positions 0..lengths[b] (the new token included), o, residual,
              rmsnorm, gate_up, silu*mul, down, residual -> final norm, lm_head, greedy argmax;
              the token and ``lengths`` are updated on the device, so a captured step replays
              as a chain with no host involvement

Three paths (a tileship operator is used only where the loaded release has it; its dispatcher
then picks kernel or reference per call, and the Decision counts captured during the CUDA graph
capture are reported per operator):

    torch_fp16      F.linear (cuBLAS), decode attention = F.scaled_dot_product_attention(enable_gqa)
                    over the whole cache capacity with a boolean mask of valid positions (the
                    gpt-fast style), torch.nn.functional.rms_norm
    tileship_fp16   the same weights; ``torch.ops.tileship_<id>.gqa_decode(q, k_cache, v_cache,
                    lengths)`` (lengths = valid positions), ``rmsnorm(X, W)`` when its declared
                    eps equals the model's, and the fp16 GEMM op for the linears whose (N, K) the
                    release declares (it takes W^T); everything else as torch_fp16
    tileship_w4a16  as tileship_fp16, but every linear (qkv, o, gate_up, down, lm_head) is
                    ``w4a16_linear(x, qweight[N,K/8] int32, scales[N,K/128])`` on int4 weights from
                    ``tileship.catalog.w4a16.quantize`` (a fallback packer here when that is missing or differs);
                    without the op in the release: its reference, dequantize + matmul, traced

Modes: ``compile+graph`` (the two halves of a layer, before and after the KV-cache write, and the
head each compiled once per (path, batch, context) with default inductor, dynamic=False,
fullgraph=True; the cache write itself runs eagerly in place, see ``write_kv``; then the whole step captured in a
torch.cuda.CUDAGraph by hand) and ``eager+graph`` (no compile: the fast fallback). On a CPU:
``eager`` and ``compile`` (no graph), a dry run only.

Per (batch, context, path): prefill ms (eager, CUDA events), decode step ms (CUDA events over
--iters replays, median of --repeats; ``lengths`` reset between repeats), tokens/s = B / step
time, peak memory (max_memory_allocated, reset per path), the share of decode time per operator
from torch.profiler over --profile-replays replays (kernels grouped into linear/gemm, w4a16,
attention, norm, rope/cache-write, other; a kernel launched inside a tileship op takes that op's
category, TileLang kernels all being named ``main_kernel``). Correctness at batch --check-batch:
tileship_fp16's greedy tokens vs torch_fp16's for --check-steps steps (first mismatch step and
the logit margin there), and tileship_w4a16's logits vs the same int4 model run eagerly with
the reference (dequantize + matmul, torch attention and norms), rel L2 <= --w4a16-tol.

    PYTHONPATH=/tmp/site:$PWD/src python3 benchmarks/decode_e2e.py --release DIR --out decode_e2e.json

JSON: ``dtypes -> float16 -> cases -> decode_b1_ctx1024 -> modes -> compile+graph -> {torch_ms,
tileship_ms, ratio (= tileship / torch, model_e2e's convention), w4a16_ms, ratio_w4a16,
ratio_w4a16_vs_torch (= torch / w4a16), paths -> {torch_fp16, tileship_fp16, tileship_w4a16} ->
{step_ms, tokens_per_s, ...}}``; ``ratio_direction`` spells out every ratio. Exit status 0 when
every check passed and nothing failed; 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import re
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PATHS = ("torch_fp16", "tileship_fp16", "tileship_w4a16")
GPU_MODES = ("compile+graph", "eager+graph")
CPU_MODES = ("eager", "compile")
LINEARS = ("qkv", "o", "gate_up", "down")
CATEGORIES = ("linear/gemm", "w4a16", "attention", "norm", "rope/cache-write", "other")
#: role -> default release operator name (override with --ops role=name; an empty name: never use one)
DEFAULT_OPS = {"rmsnorm": "rmsnorm", "attention": "gqa_decode", "linear": "linear", "w4a16": "w4a16_linear",
               "add_rmsnorm": "add_rmsnorm"}
ROLE_CATEGORY = {"rmsnorm": "norm", "attention": "attention", "linear": "linear/gemm", "w4a16": "w4a16",
                 "add_rmsnorm": "norm"}
#: declared input ranks a role's operator must have (else it is not used, and the plan says so)
ROLE_RANKS = {"rmsnorm": (2, 1), "attention": (3, 4, 4, 1), "linear": (2, 2), "w4a16": (2, 2, 2),
              "add_rmsnorm": (2, 2, 1)}
GROUP = 128
#: nibble j of each int32 holds element NIBBLE_ORDER[j] of its group of 8
NIBBLE_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
RATIO_DIRECTION = {
    "ratio": "tileship_ms / torch_ms (tileship_fp16 decode step over torch_fp16's; below 1: tileship faster; "
             "model_e2e's convention)",
    "ratio_w4a16": "w4a16_ms / torch_ms (below 1: tileship_w4a16 faster)",
    "ratio_w4a16_vs_torch": "torch_ms / w4a16_ms (a speedup: above 1: tileship_w4a16 faster; issue 12 target >= 2 at "
                            "batch 1)",
    "ratio_fp16_vs_torch": "torch_ms / tileship_ms (a speedup: above 1: tileship_fp16 faster; issue 12 target >= 1.05 "
                           "at batch 1)",
    "tokens_per_s": "batch / decode step seconds (one new token per sequence per step)",
    "prefill": "same directions for prefill ms (eager forward over the prompt)",
}


# -- the model --------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    hidden: int = 4096
    layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    vocab: int = 128256
    eps: float = 1e-5
    rope_theta: float = 500000.0
    init_scale: float = 0.02

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """name -> (N, K) of the weight [N, K]."""
        return {"qkv": (self.q_size + 2 * self.kv_size, self.hidden), "o": (self.hidden, self.q_size),
                "gate_up": (2 * self.intermediate, self.hidden), "down": (self.hidden, self.intermediate),
                "lm_head": (self.vocab, self.hidden)}


def random_weights(cfg: Config, dtype: Any, device: Any, seed: int = 0) -> dict[str, Any]:
    """{"embed", "norm", "lm_head", "layers": [{"attn_norm", "qkv", "o", "mlp_norm",
    "gate_up", "down"}]}, weights [N, K]."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int) -> Any:
        return torch.randn(shape, generator=g, device=device, dtype=dtype).mul_(cfg.init_scale)

    def norm_w() -> Any:
        return rnd(cfg.hidden).add_(1.0)

    shapes = cfg.linear_shapes()
    layers = []
    for _ in range(cfg.layers):
        layer = {"attn_norm": norm_w(), "mlp_norm": norm_w()}
        layer.update({name: rnd(*shapes[name]) for name in LINEARS})
        layers.append(layer)
    return {"embed": rnd(cfg.vocab, cfg.hidden), "norm": norm_w(), "lm_head": rnd(*shapes["lm_head"]), "layers": layers}


def rope_tables(cfg: Config, capacity: int, device: Any) -> tuple[Any, Any]:
    """cos, sin [capacity, head_dim/2] float32 (rotate-half RoPE)."""
    import torch

    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    ang = torch.arange(capacity, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float().to(device), ang.sin().float().to(device)


def rope(x: Any, cos: Any, sin: Any) -> Any:
    """Rotate-half RoPE on the last dim of ``x``; cos/sin broadcast to x[..., :D/2], float32 math."""
    import torch

    d = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :d], xf[..., d:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


# -- W4A16 packing (tileship.catalog.w4a16 when it exists) ------------------------------------
def quantize_fallback(weight: Any, group: int = GROUP) -> tuple[Any, Any]:
    """weight [N, K] -> (qweight [N, K/8] int32, scales [N, K/group] in weight's dtype).

    Symmetric int4 per group of ``group`` along K: s = absmax/7 (rounded to the scale dtype
    first, and that rounded s is what quantizes), q = round(w/s) + 8 clamped to 0..15; 8 nibbles
    per int32, nibble j holding element NIBBLE_ORDER[j] of each group of 8."""
    import torch

    n, k = weight.shape
    if k % group or k % 8:
        raise ValueError(f"K={k} is not a multiple of the group {group} (and of 8)")
    if n > 8192:  # bound the float32/int64 temporaries (lm_head: 128256 rows)
        parts = [quantize_fallback(weight[i:i + 8192], group) for i in range(0, n, 8192)]
        return torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])
    w = weight.float().view(n, k // group, group)
    scales = (w.abs().amax(-1) / 7).to(weight.dtype)
    s = scales.float()
    s = torch.where(s > 0, s, torch.ones_like(s))  # an all-zero group: any scale gives q = 8
    q = (torch.round(w / s.unsqueeze(-1)) + 8).clamp_(0, 15).to(torch.int64).view(n, k // 8, 8)
    packed = torch.zeros(n, k // 8, dtype=torch.int64, device=weight.device)
    for j, e in enumerate(NIBBLE_ORDER):
        packed |= q[..., e] << (4 * j)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)  # two's complement into int32
    return packed.to(torch.int32).contiguous(), scales.contiguous()


_INVERSE_ORDER = tuple(NIBBLE_ORDER.index(e) for e in range(8))


def dequantize_fallback(qweight: Any, scales: Any, group: int = GROUP) -> Any:
    """(qweight [N, K/8] int32, scales [N, K/group]) -> weight [N, K] in scales' dtype."""
    import torch

    n, k8 = qweight.shape
    k = k8 * 8
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=qweight.device)
    nib = (qweight.unsqueeze(-1) >> shifts) & 0xF  # [N, K/8, 8]: nibble j
    q = nib[..., list(_INVERSE_ORDER)].reshape(n, k // group, group)
    return ((q.to(scales.dtype) - 8) * scales.unsqueeze(-1)).reshape(n, k)


def packing() -> tuple[Callable[..., Any], Callable[..., Any], str]:
    """(quantize, dequantize, where they come from): the catalog's when importable, else the fallback."""
    try:
        from tileship.catalog.w4a16 import dequantize, quantize  # type: ignore[import-not-found]

        return quantize, dequantize, "tileship.catalog.w4a16"
    except Exception as exc:  # noqa: BLE001  # not written yet, or a half-written module: say so, use ours
        return (
            quantize_fallback,
            dequantize_fallback,
            f"fallback in benchmarks/decode_e2e.py ({type(exc).__name__}: {exc})"[:300],
        )


# -- one path's operators -----------------------------------------------------------------------
def torch_rmsnorm(eps: float) -> Callable[[Any, Any], Any]:
    import torch

    def rmsnorm(x: Any, w: Any) -> Any:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)

    return rmsnorm


def torch_linear(x: Any, w: Any) -> Any:
    import torch

    return torch.nn.functional.linear(x, w)


def sdpa_decode(q: Any, k_cache: Any, v_cache: Any, valid: Any, mask: Any) -> Any:
    """q [B, Hq, D], caches [B, S, Hkv, D], mask [B, 1, 1, S] bool -> [B, Hq, D]."""
    import torch

    o = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k_cache.transpose(1, 2),
                                                         v_cache.transpose(1, 2), attn_mask=mask, enable_gqa=True)
    return o.squeeze(2)


@dataclass
class PathOps:
    """What one path runs: per role a callable, per linear a callable and its weight tensors."""

    name: str
    rmsnorm: Callable[[Any, Any], Any]
    #: (q, k_cache, v_cache, valid int32 [B], mask [B,1,1,S] bool or None) -> o
    attention: Callable[..., Any]
    needs_mask: bool
    #: linear name (qkv, o, gate_up, down, lm_head) -> (x, *weights) -> y
    linear: dict[str, Callable[..., Any]]
    #: {"embed", "norm", "lm_head": tuple, "layers": [{"attn_norm", "mlp_norm", <linear>: tuple}]}
    weights: dict[str, Any]
    #: what serves each logical operator and why
    plan: dict[str, dict[str, str]] = field(default_factory=dict)
    #: (x, residual, w) -> (rmsnorm(x + residual), x + residual) in one call; None: the two steps
    fused_add_norm: Callable[[Any, Any, Any], Any] | None = None

    def add_rmsnorm(self, x: Any, residual: Any, w: Any) -> tuple[Any, Any]:
        """(the normed sum, the sum): the new residual and the next block's input."""
        if self.fused_add_norm is not None:
            y, h = self.fused_add_norm(x, residual, w)
            return y, h
        h = x + residual
        return self.rmsnorm(h, w), h

    def weight_bytes(self) -> int:
        seen: dict[int, int] = {}

        def add(t: Any) -> None:
            if isinstance(t, (tuple, list)):
                for x in t:
                    add(x)
            elif isinstance(t, dict):
                for x in t.values():
                    add(x)
            elif hasattr(t, "untyped_storage"):
                st = t.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()

        add(self.weights)
        return sum(seen.values())


def _release_op(release: Any, torch_ops: Any, role: str, name: str, dtype_name: str) -> tuple[Any | None, str]:
    """(the custom op, why) or (None, why not) for a role's operator in the release."""
    if not name:
        return None, f"--ops {role}= (empty): not used"
    if release is None:
        return None, "no release loaded"
    if name not in release.ops:
        return None, f"the release has no {name!r} operator (it has: {', '.join(sorted(release.ops))})"
    decl = release.declarations.get(name, {})
    ranks = tuple(len(dims) for _, dims, *_ in decl.get("inputs", ()))
    if ranks != ROLE_RANKS[role]:
        return None, f"{name} is declared with input ranks {ranks}; the {role} role needs {ROLE_RANKS[role]}"
    runner = release.ops[name]
    specs = [e for e in runner.entries if e.spec is not None]
    in_dtype = [e for e in specs if e.spec.dtype == dtype_name]
    serving = sorted({f"{e.decision.path}:{e.decision.reason}" for e in in_dtype})
    why = (f"{name}: {len(in_dtype)} specialization(s) in {dtype_name} (now serving {', '.join(serving) or 'none'}) of "
           f"{len(specs)}; "
           "the dispatcher decides per call")
    return torch_ops[name], why


def _covers(release: Any, name: str, dtype_name: str, fixed: Mapping[str, int]) -> bool:
    """Whether a specialization of ``name`` in ``dtype_name`` has these fixed dims (static or
    in a range's fixed dims)."""
    for e in release.ops[name].entries:
        s = e.spec
        if s is None or s.dtype != dtype_name:
            continue
        dims = s.dim_map()
        if all(d in dims and not isinstance(dims[d], tuple) and dims[d] == v for d, v in fixed.items()):
            return True
    return False


def make_path(name: str, cfg: Config, weights: Mapping[str, Any], *, release: Any = None,
              ops_names: Mapping[str, str] | None = None, quantized: Mapping[str, Any] | None = None,
              packer: tuple[Callable[..., Any], Callable[..., Any], str] | None = None) -> PathOps:
    """Build one path over shared fp16 ``weights`` (and ``quantized``: the same tree with
    (qweight, scales) per linear)."""
    import torch

    names = {**DEFAULT_OPS, **(ops_names or {})}
    dtype = weights["embed"].dtype
    dtype_name = str(dtype).removeprefix("torch.")
    torch_ops = None
    if release is not None and name != "torch_fp16":
        from tileship.torchops.custom_ops import register

        torch_ops = register(release)
    plan: dict[str, dict[str, str]] = {}
    rmsnorm = torch_rmsnorm(cfg.eps)
    plan["rmsnorm"] = {"impl": "torch:F.rms_norm", "reason": "the PyTorch path"}
    attention: Callable[..., Any] = sdpa_decode
    needs_mask = True
    plan["decode_attention"] = {"impl": "torch:sdpa(enable_gqa, bool mask over the cache capacity)",
                                "reason": "the PyTorch path"}
    plan["prefill_attention"] = {"impl": "torch:sdpa(is_causal, enable_gqa)",
                                 "reason": "every path: no causal GQA prefill operator is used here"}
    linear = {n: torch_linear for n in (*LINEARS, "lm_head")}
    tree: dict[str, Any] = {"embed": weights["embed"], "norm": weights["norm"], "lm_head": (weights["lm_head"],),
                            "layers": [{"attn_norm": lw["attn_norm"], "mlp_norm": lw["mlp_norm"],
                                        **{n: (lw[n],) for n in LINEARS}}
                                       for lw in weights["layers"]]}
    for n in (*LINEARS, "lm_head"):
        plan[f"linear.{n}"] = {"impl": "torch:F.linear (cuBLAS)", "reason": "the PyTorch path"}
    if name == "torch_fp16":
        return PathOps(name, rmsnorm, attention, needs_mask, linear, tree, plan)
    if name not in PATHS:
        raise ValueError(f"unknown path {name!r} (known: {', '.join(PATHS)})")

    op, why = _release_op(release, torch_ops, "rmsnorm", names["rmsnorm"], dtype_name)
    if op is not None:
        want = release.declarations[names["rmsnorm"]].get("config", {}).get("eps")
        if want is None or float(want) != float(cfg.eps):
            op, why = None, (f"{names['rmsnorm']} declares eps {want}, the model uses {cfg.eps:g} (--rms-eps): "
                             "its result would differ")
    if op is not None:
        rmsnorm = op
    plan["rmsnorm"] = {"impl": f"tileship:{names['rmsnorm']}" if op is not None else "torch:F.rms_norm", "reason": why}

    fused, why = _release_op(release, torch_ops, "add_rmsnorm", names["add_rmsnorm"], dtype_name)
    if fused is not None:
        want = release.declarations[names["add_rmsnorm"]].get("config", {}).get("eps")
        if want is None or float(want) != float(cfg.eps):
            fused, why = None, f"{names['add_rmsnorm']} declares eps {want}, the model uses {cfg.eps:g} (--rms-eps)"
    plan["add_rmsnorm"] = {"impl": f"tileship:{names['add_rmsnorm']}" if fused is not None
                           else "x + residual, then the rmsnorm above", "reason": why}

    op, why = _release_op(release, torch_ops, "attention", names["attention"], dtype_name)
    if op is not None:
        gqa = op

        def attention(q: Any, k_cache: Any, v_cache: Any, valid: Any, mask: Any) -> Any:
            return gqa(q, k_cache, v_cache, valid)

        needs_mask = False
    plan["decode_attention"] = {
        "impl": f"tileship:{names['attention']}" if op is not None else plan["decode_attention"]["impl"],
        "reason": why,
    }

    shapes = cfg.linear_shapes()
    if name == "tileship_fp16":
        op, why = _release_op(release, torch_ops, "linear", names["linear"], dtype_name)
        for n in (*LINEARS, "lm_head"):
            nn_, kk = shapes[n]
            decl = release.declarations[names["linear"]]["inputs"] if op is not None else None
            # F.linear's layout (x [M, K], weight [N, K]) takes the weight as it is; a GEMM's (B [K, N]) W^T
            as_is = decl is not None and tuple(decl[1][1]) == ("N", "K")
            fixed = {"N": nn_, "K": kk} if as_is else ({decl[1][1][1]: nn_, decl[1][1][0]: kk} if decl else {})
            if op is not None and _covers(release, names["linear"], dtype_name, fixed):
                gemm = op

                def lin(x: Any, wt: Any, gemm: Any = gemm) -> Any:
                    return gemm(x, wt)

                linear[n] = lin
                # only covered linears keep their own copy of the weight (W^T for a GEMM)
                if n == "lm_head":
                    tree["lm_head"] = (weights["lm_head"] if as_is else weights["lm_head"].t().contiguous(),)
                else:
                    for lw, t in zip(weights["layers"], tree["layers"], strict=True):
                        t[n] = (lw[n] if as_is else lw[n].t().contiguous(),)
                plan[f"linear.{n}"] = {"impl": f"tileship:{names['linear']}",
                                       "reason": f"declares N={nn_}, K={kk}; {why}"}
            else:
                reason = (
                    why
                    if op is None
                    else f"{names['linear']} declares no {dtype_name} specialization with N={nn_}, K={kk}"
                )
                plan[f"linear.{n}"] = {"impl": "torch:F.linear (cuBLAS)", "reason": reason}
    else:  # tileship_w4a16
        if quantized is None or packer is None:
            raise ValueError("tileship_w4a16 needs quantized weights and the packer")
        op, why = _release_op(release, torch_ops, "w4a16", names["w4a16"], dtype_name)
        dequantize = packer[1]
        if op is not None:
            w4 = op

            def lin4(x: Any, qw: Any, s: Any) -> Any:
                return w4(x, qw, s)
        else:
            def lin4(x: Any, qw: Any, s: Any) -> Any:
                return torch.nn.functional.linear(x, dequantize(qw, s))
        source = "catalog packing" if packer[2].startswith("tileship") else "fallback packing"
        impl = f"tileship:{names['w4a16']}" if op is not None else f"reference: dequantize + matmul ({source})"
        for n in (*LINEARS, "lm_head"):
            linear[n] = lin4
            plan[f"linear.{n}"] = {"impl": impl, "reason": why}
        tree["lm_head"] = quantized["lm_head"]
        for q, t in zip(quantized["layers"], tree["layers"], strict=True):
            for n in LINEARS:
                t[n] = q[n]
    return PathOps(name, rmsnorm, attention, needs_mask, linear, tree, plan, fused)


def w4a16_reference_path(cfg: Config, weights: Mapping[str, Any], quantized: Mapping[str, Any],
                         packer: tuple[Any, Any, str]) -> PathOps:
    """The int4 model with every operator on its reference: dequantize + matmul, torch norms and attention."""
    return make_path("tileship_w4a16", cfg, weights, release=None, quantized=quantized, packer=packer)


def quantize_weights(weights: Mapping[str, Any], quantize: Callable[..., Any]) -> dict[str, Any]:
    def q(w: Any) -> tuple[Any, Any]:
        out = quantize(w)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            n = len(out) if isinstance(out, (tuple, list)) else "?"
            raise TypeError(f"quantize() returned {type(out).__name__} of {n} items; expected (qweight, scales)")
        return (out[0].contiguous(), out[1].contiguous())

    return {"lm_head": q(weights["lm_head"]), "layers": [{n: q(lw[n]) for n in LINEARS} for lw in weights["layers"]]}


# -- the decode state and the forward passes -------------------------------------------------------
@dataclass
class State:
    """Static buffers of one (path, batch, capacity): what a captured step reads and writes."""

    k: list[Any]
    v: list[Any]
    lengths: Any  # int32 [B]
    tokens: Any  # int64 [B]: the input token of the next step (the last one generated)
    row_base: Any  # int64 [B]: b * S_cap, for writes into the flattened cache
    positions: Any  # int32 [S_cap]
    cos: Any
    sin: Any
    capacity: int
    layers: int


def new_state(cfg: Config, batch: int, capacity: int, layers: int, dtype: Any, device: Any) -> State:
    import torch

    shape = (batch, capacity, cfg.n_kv_heads, cfg.head_dim)
    cos, sin = rope_tables(cfg, capacity, device)
    return State(k=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                 v=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                 lengths=torch.zeros(batch, dtype=torch.int32, device=device),
                 tokens=torch.zeros(batch, dtype=torch.int64, device=device),
                 row_base=torch.arange(batch, dtype=torch.int64, device=device) * capacity,
                 positions=torch.arange(capacity, dtype=torch.int32, device=device), cos=cos, sin=sin,
                 capacity=capacity, layers=layers)


def layer_qkv(p: PathOps, cfg: Config, x: Any, w: Mapping[str, Any], cos: Any, sin: Any) -> tuple[Any, Any, Any]:
    """The first half of a decoder layer: x [B, H] -> q [B, Hq, D], k and v [B, Hkv, D] (rope applied)."""
    b = x.shape[0]
    h = p.rmsnorm(x, w["attn_norm"])
    qkv = p.linear["qkv"](h, *w["qkv"])
    q, k, v = qkv.split((cfg.q_size, cfg.kv_size, cfg.kv_size), dim=-1)
    q = rope(q.reshape(b, cfg.n_heads, cfg.head_dim), cos[:, None, :], sin[:, None, :])
    k = rope(k.reshape(b, cfg.n_kv_heads, cfg.head_dim), cos[:, None, :], sin[:, None, :])
    return q.contiguous(), k, v.reshape(b, cfg.n_kv_heads, cfg.head_dim)


def write_kv(cfg: Config, k_cache: Any, v_cache: Any, write_at: Any, k: Any, v: Any) -> None:
    """k/v written in place at ``write_at`` (flat row b*S + lengths[b]): two row scatters, no host sync.

    Always run eagerly, between the two compiled halves of a layer: inside a compiled region the
    in-place write to a graph input is functionalized into an out-of-place copy of the whole cache
    and a copy back (measured on the H200, `a807c89d`: 2 x 8 ms per step at B=32, ctx 8k), which
    would hide every kernel's gain behind the benchmark's own cache traffic."""
    k_cache.view(-1, cfg.n_kv_heads, cfg.head_dim).index_copy_(0, write_at, k)
    v_cache.view(-1, cfg.n_kv_heads, cfg.head_dim).index_copy_(0, write_at, v)


def layer_out(p: PathOps, cfg: Config, x: Any, w: Mapping[str, Any], q: Any, k_cache: Any, v_cache: Any, valid: Any,
              mask: Any) -> Any:
    """The second half: attention over the cache (read only), output projection, MLP -> x [B, H]."""
    import torch

    b = x.shape[0]
    o = p.attention(q, k_cache, v_cache, valid, mask)
    h, x = p.add_rmsnorm(p.linear["o"](o.reshape(b, cfg.q_size), *w["o"]), x, w["mlp_norm"])
    gate, up = p.linear["gate_up"](h, *w["gate_up"]).chunk(2, dim=-1)
    return x + p.linear["down"](torch.nn.functional.silu(gate) * up, *w["down"])


def decode_layer(p: PathOps, cfg: Config, x: Any, w: Mapping[str, Any], k_cache: Any, v_cache: Any, write_at: Any,
                 valid: Any, mask: Any, cos: Any, sin: Any) -> Any:
    """One decoder layer for one new token per sequence: x [B, H] -> [B, H]; writes k/v at
    ``write_at`` (flat row b*S + lengths[b])."""
    q, k, v = layer_qkv(p, cfg, x, w, cos, sin)
    write_kv(cfg, k_cache, v_cache, write_at, k, v)
    return layer_out(p, cfg, x, w, q, k_cache, v_cache, valid, mask)


def head(p: PathOps, x: Any, norm_w: Any, lm: tuple[Any, ...]) -> Any:
    """x [B, H] -> logits [B, vocab]."""
    return p.linear["lm_head"](p.rmsnorm(x, norm_w), *lm)


@dataclass
class Stepper:
    """A decode step of one path over one State: ``step()`` runs it (eager or with compiled
    parts) and returns the logits."""

    p: PathOps
    cfg: Config
    st: State
    layer_fn: Callable[..., Any]
    head_fn: Callable[..., Any]

    def step(self) -> Any:
        import torch

        p, st = self.p, self.st
        x = torch.nn.functional.embedding(st.tokens, p.weights["embed"])
        # clamped: a step past the capacity rewrites the last slot instead of writing out of bounds
        pos = st.lengths.long().clamp(max=st.capacity - 1)
        valid = (pos + 1).to(torch.int32)  # the positions attention sees, the new one included
        write_at = st.row_base + pos
        cos, sin = st.cos.index_select(0, pos), st.sin.index_select(0, pos)
        mask = (st.positions[None, :] < valid[:, None]).view(x.shape[0], 1, 1, st.capacity) if p.needs_mask else None
        for i in range(st.layers):
            x = self.layer_fn(x, p.weights["layers"][i], st.k[i], st.v[i], write_at, valid, mask, cos, sin)
        logits = self.head_fn(x, p.weights["norm"], p.weights["lm_head"])
        st.tokens.copy_(logits.argmax(dim=-1))
        st.lengths.add_(1)
        return logits


def make_stepper(p: PathOps, cfg: Config, st: State, compiled: bool) -> Stepper:
    def qkv_fn(x: Any, w: Any, cos: Any, sin: Any) -> Any:
        return layer_qkv(p, cfg, x, w, cos, sin)

    def out_fn(x: Any, w: Any, q: Any, kc: Any, vc: Any, valid: Any, mask: Any) -> Any:
        return layer_out(p, cfg, x, w, q, kc, vc, valid, mask)

    def head_fn(x: Any, norm_w: Any, lm: Any) -> Any:
        return head(p, x, norm_w, lm)

    if compiled:  # two compiled halves per layer; the cache write between them stays eager (``write_kv``)
        import torch

        qkv_fn = torch.compile(qkv_fn, dynamic=False, fullgraph=True)
        out_fn = torch.compile(out_fn, dynamic=False, fullgraph=True)
        head_fn = torch.compile(head_fn, dynamic=False, fullgraph=True)

    def layer_fn(x: Any, w: Any, kc: Any, vc: Any, write_at: Any, valid: Any, mask: Any, cos: Any, sin: Any) -> Any:
        q, k, v = qkv_fn(x, w, cos, sin)
        write_kv(cfg, kc, vc, write_at, k, v)
        return out_fn(x, w, q, kc, vc, valid, mask)

    return Stepper(p, cfg, st, layer_fn, head_fn)


def prefill(p: PathOps, cfg: Config, st: State, prompt: Any) -> Any:
    """One eager forward over ``prompt`` [B, P] filling positions 0..P-1 of the cache; sets lengths = P and
    tokens = the greedy next token; returns the last position's logits [B, vocab]."""
    import torch

    F = torch.nn.functional
    b, n = prompt.shape
    x = F.embedding(prompt, p.weights["embed"])
    cos, sin = st.cos[:n][:, None, :], st.sin[:n][:, None, :]
    for i in range(st.layers):
        w = p.weights["layers"][i]
        h = p.rmsnorm(x.reshape(b * n, cfg.hidden), w["attn_norm"])
        q, k, v = p.linear["qkv"](h, *w["qkv"]).view(b, n, -1).split((cfg.q_size, cfg.kv_size, cfg.kv_size), dim=-1)
        q = rope(q.reshape(b, n, cfg.n_heads, cfg.head_dim), cos, sin)
        k = rope(k.reshape(b, n, cfg.n_kv_heads, cfg.head_dim), cos, sin)
        v = v.reshape(b, n, cfg.n_kv_heads, cfg.head_dim)
        st.k[i][:, :n].copy_(k)
        st.v[i][:, :n].copy_(v)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           enable_gqa=True)
        del q, k, v
        x = x + p.linear["o"](o.transpose(1, 2).reshape(b * n, cfg.q_size), *w["o"]).view(b, n, cfg.hidden)
        del o
        h = p.rmsnorm(x.reshape(b * n, cfg.hidden), w["mlp_norm"])
        gate, up = p.linear["gate_up"](h, *w["gate_up"]).chunk(2, dim=-1)
        del h
        x = x + p.linear["down"](F.silu(gate) * up, *w["down"]).view(b, n, cfg.hidden)
        del gate, up
    logits = head(p, x[:, -1].contiguous(), p.weights["norm"], p.weights["lm_head"])
    st.tokens.copy_(logits.argmax(dim=-1))
    st.lengths.fill_(n)
    return logits


def sdpa_backends(cfg: Config, batch: int, capacity: int, dtype: Any) -> dict[str, Any]:
    """Which SDPA backends accept the torch path's decode call (q [B,Hq,1,D], cache views
    [B,Hkv,S,D], bool mask, enable_gqa)."""
    import torch

    q = torch.empty(batch, cfg.n_heads, 1, cfg.head_dim, dtype=dtype, device="cuda")
    kv = torch.empty(batch, capacity, cfg.n_kv_heads, cfg.head_dim, dtype=dtype, device="cuda").transpose(1, 2)
    mask = torch.ones(batch, 1, 1, capacity, dtype=torch.bool, device="cuda")
    try:
        params = torch.backends.cuda.SDPAParams(q, kv, kv, mask, 0.0, False, True)
    except Exception as exc:  # noqa: BLE001  # the constructor changed across torch versions
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    out: dict[str, Any] = {}
    for name in ("flash", "efficient", "cudnn"):
        fn = getattr(torch.backends.cuda, f"can_use_{name}_attention", None)
        try:
            out[name] = bool(fn(params, False)) if fn is not None else None
        except Exception as exc:  # noqa: BLE001
            out[name] = f"{type(exc).__name__}: {exc}"[:200]
    out["note"] = (
        "math is the fallback when none of these accepts the call; profile.top_kernels names the kernel that ran"
    )
    return out


def reset(st: State, prompt_len: int, first_tokens: Any) -> None:
    """Back to the state right after prefill (the cache beyond the prompt is simply overwritten)."""
    st.lengths.fill_(prompt_len)
    st.tokens.copy_(first_tokens)


# -- measurement helpers ---------------------------------------------------------------------------
def rel_l2(a: Any, b: Any) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def counters_delta(before: Mapping[str, Mapping[str, int]],
                   after: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for op, counts in after.items():
        d = {k: v - before.get(op, {}).get(k, 0) for k, v in counts.items()}
        d = {k: v for k, v in d.items() if v}
        if d:
            out[op] = d
    return out


class Clock:
    def __init__(self, cuda: bool) -> None:
        import torch

        self.torch = torch
        self.cuda = cuda

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def ms(self, fn: Callable[[], Any], iters: int = 1) -> float:
        """Milliseconds per call of ``fn`` over ``iters`` back-to-back calls (CUDA events on a GPU)."""
        torch = self.torch
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / iters
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t) * 1e3 / iters


def capture(step: Callable[[], Any], before_capture: Callable[[], Any],
            warmup: int = 3) -> tuple[Callable[[], Any], Any, Any]:
    """Warm ``step`` up on a side stream, call ``before_capture`` (a counter snapshot, after any
    state reset), capture one call in a CUDAGraph: (replay, static logits, the snapshot)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    snap = before_capture()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph.replay, out, snap


_CLASSES = (
    ("w4a16", re.compile(r"w4a16|int4|_weight_int4pack|dequant|bitwise_and|rshift", re.I)),
    ("attention", re.compile(r"attention|attn|fmha|flash|sdpa|softmax|\bmha", re.I)),
    ("norm", re.compile(r"rms_?norm|rsqrt|layer_?norm", re.I)),
    ("linear/gemm",
     re.compile(r"gemm|gemv|nvjet|xmma|cutlass|cublas|splitkreduce|s16816|wgmma|matmul|aten::(?:mm|addmm|bmm|linear)$",
                re.I)),
    ("rope/cache-write",
     re.compile(r"index_put|index_copy|scatter|rope|rotary|_cat_|_cat$|aten::cat$|\bcos\b|_cos_|_sin_|\bsin\b", re.I)),
)


def classify(name: str) -> str | None:
    for cat, rx in _CLASSES:
        if rx.search(name):
            return cat
    return None


def _context_category(evt: Any, roles: Mapping[str, str]) -> str | None:
    """The category of the nearest enclosing tileship op (any depth), else of the nearest classifiable op."""
    chain = []
    e = evt
    while e is not None:
        chain.append(e.name)
        e = e.cpu_parent
    for n in chain:
        if n.startswith("tileship_") and "::" in n:
            op = n.split("::", 1)[1]
            return ROLE_CATEGORY.get(roles.get(op, ""), "other")
    for n in chain:
        cat = classify(n)
        if cat is not None:
            return cat
    return None


def _launch_sequence(events: Any, roles: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """(kernel name, context category) in launch order, from a profile of a non-graph step."""
    out = []
    cpu_events = sorted((e for e in events if getattr(e, "kernels", None)), key=lambda e: e.time_range.start)
    for e in cpu_events:
        cat = _context_category(e, roles)
        for k in e.kernels:
            out.append((k.name, cat))
    return out


def profile_shares(run: Callable[[int], Any], attribution_run: Callable[[], Any] | None, replays: int, cuda: bool,
                   roles: Mapping[str, str]) -> dict[str, Any]:
    """Share of device time per category over ``replays`` calls of ``run`` (graph replays on a GPU).
    ``attribution_run``: one non-graph step, profiled to learn which op launched which kernel."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sequence: list[tuple[str, str | None]] = []
    if cuda and attribution_run is not None:
        with profile(activities=acts) as prof:
            attribution_run()
            torch.cuda.synchronize()
        sequence = _launch_sequence(prof.events(), roles)
    with profile(activities=acts) as prof:
        run(replays)
        if cuda:
            torch.cuda.synchronize()
    events = prof.events()
    if cuda:
        kern = sorted((e for e in events if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start)
        if not kern:
            return {"error": "the profiler saw no device kernels"}
        kernels = [(e.name, float(e.time_range.elapsed_us())) for e in kern]
        if attribution_run is None:  # no graph: the replays' own launches say which op ran what
            sequence = _launch_sequence(events, roles)
            replays_in_sequence = 1
        else:
            replays_in_sequence = replays
        records, attribution = attribute(kernels, sequence, replays_in_sequence)
        source = "graph replays" if attribution_run is not None else "steps"
    else:
        leaves = [e for e in events if e.device_type == DeviceType.CPU and not e.cpu_children]
        records = [(e.name, float(e.self_cpu_time_total), _context_category(e, roles)) for e in leaves]
        attribution, source = "the enclosing op", "CPU ops (leaf self time)"
    return summarize(records, replays, source, attribution)


def attribute(kernels: list[tuple[str, float]], sequence: list[tuple[str, str | None]],
              replays: int) -> tuple[list[tuple[str, float, str | None]], str]:
    """Give each device kernel (name, us), in execution order, the category of the op that launched it.

    ``sequence``: (name, category) in launch order for one non-graph step (or the profiled calls
    themselves with ``replays`` 1). Kernel i takes ``sequence[i % len]`` when the counts match (a
    replay runs the captured launches in order). When a replay has a few kernels more or fewer
    than the step (a memset, a copy the graph dropped), each replay's names are aligned with the
    step's (``difflib``, longest matching runs) and the matched kernels take their launch's
    category; the rest, and every kernel when replays differ in length, fall back to their name
    (when every launch of that name had one category), else None."""
    import difflib

    if sequence and len(kernels) == replays * len(sequence):
        return ([(n, t, sequence[i % len(sequence)][1]) for i, (n, t) in enumerate(kernels)],
                "launch order of a profiled non-graph step (kernel counts match)")
    by_name: dict[str, set[str | None]] = {}
    for n, c in sequence:
        by_name.setdefault(n, set()).add(c)

    def named(n: str) -> str | None:
        return next(iter(by_name[n])) if len(by_name.get(n, ())) == 1 else None

    per = len(kernels) // replays if replays and len(kernels) % replays == 0 else 0
    if sequence and per:
        step = [n for n, _ in sequence]
        out: list[tuple[str, float, str | None]] = []
        matched = 0
        for r in range(replays):
            chunk = kernels[r * per:(r + 1) * per]
            cats: list[str | None] = [named(n) for n, _ in chunk]
            blocks = difflib.SequenceMatcher(a=[n for n, _ in chunk], b=step, autojunk=False).get_matching_blocks()
            for blk in blocks:
                for j in range(blk.size):
                    cats[blk.a + j] = sequence[blk.b + j][1]
                matched += blk.size
            out += [(n, t, c) for (n, t), c in zip(chunk, cats, strict=True)]
        return out, (f"launch order aligned by name ({per} kernels per replay vs {len(sequence)} launches in the "
                     f"non-graph step; {matched / replays:g} per replay matched, the rest by name)")
    out = [(n, t, named(n)) for n, t in kernels]
    return out, (
        f"by kernel name ({len(kernels) / max(replays, 1):g} kernels per replay vs {len(sequence)} launches in the "
        "non-graph step; a name launched under several ops falls back to name patterns)"
    )


def summarize(records: list[tuple[str, float, str | None]], replays: int, source: str,
              attribution: str) -> dict[str, Any]:
    """records: (kernel name, microseconds, category from its launching op or None: then by name, else "other")."""
    per_cat = dict.fromkeys(CATEGORIES, 0.0)
    per_kernel: dict[str, list[Any]] = {}
    for n, t, ctx in records:
        cat = ctx or classify(n) or "other"
        per_cat[cat] += t
        row = per_kernel.setdefault(f"{cat}|{n}", [0.0, 0])
        row[0] += t
        row[1] += 1
    total = sum(per_cat.values()) or 1.0
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:15]
    return {"source": source, "replays": replays, "attribution": attribution,
            "total_ms_per_step": round(total / replays / 1e3, 4),
            "shares": {c: round(v / total, 4) for c, v in per_cat.items()},
            "ms_per_step": {c: round(v / replays / 1e3, 4) for c, v in per_cat.items()},
            "kernels_per_step": round(len(records) / replays, 2),
            "top_kernels": [{"category": k.split("|", 1)[0], "name": k.split("|", 1)[1][:160],
                             "ms_per_step": round(v[0] / replays / 1e3, 4),
                             "calls_per_step": round(v[1] / replays, 2)} for k, v in top]}


# -- the benchmark ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--release", type=Path,
                    help="the CUDA release directory (without one, the tileship paths run PyTorch/reference ops only)")
    ap.add_argument("--out", required=True, type=Path, help="JSON results (rewritten after every case)")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=14336)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--rms-eps", type=float, default=1e-5,
                    help="the model's RMSNorm eps; a release rmsnorm is used only when it declares the same")
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--init-scale", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--contexts", default="1024,8192",
                    help="cache capacities S_cap; the prompt is S_cap - --decode-room tokens")
    ap.add_argument("--decode-room", type=int, default=64,
                    help="cache positions left after the prompt (bounds --iters and --check-steps)")
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--modes", default="compile+graph",
                    help=f"any of {', '.join(GPU_MODES)} (on a CPU: {', '.join(CPU_MODES)})")
    ap.add_argument("--iters", type=int, default=32, help="decode replays per timed repeat (<= --decode-room)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prefill-repeats", type=int, default=1)
    ap.add_argument("--check-batch", type=int, default=1, help="the batch at which correctness is checked")
    ap.add_argument("--check-steps", type=int, default=64,
                    help="greedy steps compared between tileship_fp16 and torch_fp16")
    ap.add_argument("--logit-steps", type=int, default=8,
                    help="decode steps whose W4A16 logits are compared with the reference")
    ap.add_argument("--w4a16-tol", type=float, default=2e-2,
                    help="max rel L2 of tileship_w4a16 logits vs the int4 model on the reference")
    ap.add_argument("--profile-replays", type=int, default=3, help="0: no profile")
    ap.add_argument("--ops", default="",
                    help="role=operator overrides, roles: " + ", ".join(f"{k} (default {v})"
                                                                         for k, v in DEFAULT_OPS.items()))
    ap.add_argument("--require-evidence", action="store_true",
                    help="load without allow_unverified (kernels need verification evidence)")
    ap.add_argument("--deadline-s", type=float, default=420.0,
                    help="skip the cases not started after this many seconds (0: none); recorded as skipped and failed")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only dry-runs the script (modes eager, compile)")
    return ap.parse_args(argv)


def config_from(args: argparse.Namespace) -> Config:
    return Config(hidden=args.hidden, layers=args.layers, n_heads=args.heads, n_kv_heads=args.kv_heads,
                  head_dim=args.head_dim, intermediate=args.intermediate, vocab=args.vocab, eps=args.rms_eps,
                  rope_theta=args.rope_theta, init_scale=args.init_scale)


def _gib(n: float) -> float:
    return round(n / 2**30, 3)


def fit_layers(cfg: Config, batch: int, capacity: int, prompt: int, dtype_bytes: int,
               cuda: bool) -> tuple[int, str | None]:
    """How many layers fit this case's KV cache and prefill activations in free device memory (all when they fit)."""
    if not cuda:
        return cfg.layers, None
    import torch

    free, _ = torch.cuda.mem_get_info()
    kv_per_layer = 2 * batch * capacity * cfg.kv_size * dtype_bytes
    tokens = batch * prompt
    acts = (
        tokens
        * (4 * cfg.hidden + (cfg.q_size + 2 * cfg.kv_size) * 2 + 2 * cfg.intermediate * 2 + cfg.intermediate)
        * dtype_bytes
    )
    room = free - acts - 2 * 2**30
    n = min(cfg.layers, int(room // kv_per_layer)) if kv_per_layer else cfg.layers
    if n >= cfg.layers:
        return cfg.layers, None
    return max(n, 1), (
        f"{max(n, 1)} of {cfg.layers} layers: free {_gib(free)} GiB, KV {_gib(kv_per_layer)} GiB per layer, "
        f"prefill activations ~{_gib(acts)} GiB"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    import torch

    device = args.device
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("no CUDA device: run this on the GPU host (or --device cpu for a dry run)", file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in (GPU_MODES if cuda else CPU_MODES)]
    if bad:
        print(f"modes {bad} are not available on {device} (use {GPU_MODES if cuda else CPU_MODES})", file=sys.stderr)
        return 2
    paths = [p for p in args.paths.split(",") if p]
    overrides = dict(kv.split("=", 1) for kv in args.ops.split(",") if kv)
    if set(overrides) - set(DEFAULT_OPS) or set(paths) - set(PATHS):
        print(f"--ops roles are {', '.join(DEFAULT_OPS)}; --paths are {', '.join(PATHS)}", file=sys.stderr)
        return 2
    names = {**DEFAULT_OPS, **overrides}
    roles = {v: k for k, v in names.items() if v}
    for knob in ("recompile_limit", "cache_size_limit"):  # one layer function per (path, batch, context)
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    dtype = getattr(torch, args.dtype)
    cfg = config_from(args)
    clock = Clock(cuda)
    failures: list[str] = []
    notes: list[str] = []

    release = None
    if args.release is not None:
        import tileship

        release = tileship.load(args.release, allow_unverified=not args.require_evidence)
    else:
        notes.append("no --release: the tileship paths run PyTorch / reference operators only (a dry run, not a "
                     "tileship measurement)")
    if cuda:  # start CUPTI before any capture, so that kernels of graphs captured later are traced
        with contextlib.suppress(Exception), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
            torch.zeros(1, device=device).add_(1)
            torch.cuda.synchronize()

    result: dict[str, Any] = {
        "script": "benchmarks/decode_e2e.py",
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "host": {"gpu": torch.cuda.get_device_name(0) if cuda else platform.processor(), "torch": torch.__version__,
                 "python": platform.python_version(), "device": device},
        "release": None if release is None else {"id": release.release_id, "kernel_revision": release.kernel_revision,
                                                 "path": str(args.release), "status": release.status(),
                                                 "decisions": release.decisions()},
        "config": {**cfg.__dict__, "dtype": args.dtype, "batches": args.batches, "contexts": args.contexts,
                   "decode_room": args.decode_room, "paths": paths, "modes": modes, "iters": args.iters,
                   "repeats": args.repeats, "prefill_repeats": args.prefill_repeats,
                   "ops": names, "allow_unverified": not args.require_evidence, "check_batch": args.check_batch,
                   "check_steps": args.check_steps, "logit_steps": args.logit_steps,
                   "w4a16_tolerance_rel_l2": args.w4a16_tol, "compile": "torch.compile of each layer's two halves "
                                                                        "(before and after the in-place KV-cache "
                                                                        "write, which runs eagerly) "
                              "and of the head, default inductor, dynamic=False, fullgraph=True; "
                              "step (embedding, index math, layers, head, argmax, lengths += 1) captured in one "
                              "torch.cuda.CUDAGraph",
                   "prefill_mode": "eager (no compile, no graph), CUDA events"},
        "ratio_direction": RATIO_DIRECTION,
        "ratio_note": "ratio = tileship ms / torch ms in the same mode (below 1: tileship faster); "
                      "ratio_w4a16_vs_torch = torch ms / w4a16 ms",
        "notes": notes,
        "dtypes": {},
    }

    def flush() -> None:  # after every case: a run cut short keeps what it measured
        result["failures"] = failures
        result["seconds"] = round(time.perf_counter() - t_start, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")

    t = time.perf_counter()
    weights = random_weights(cfg, dtype, device, seed=args.seed)
    packer = packing()
    quantized = None
    if "tileship_w4a16" in paths:
        try:
            quantized = quantize_weights(weights, packer[0])
            qw, sc = quantized["layers"][0]["down"]
            n, k = cfg.linear_shapes()["down"]
            if qw.dtype != torch.int32 or tuple(qw.shape) != (n, k // 8) or tuple(sc.shape) != (n, k // GROUP):
                raise TypeError(f"qweight {qw.dtype} {tuple(qw.shape)}, scales {tuple(sc.shape)}; expected int32 ({n}, "
                                f"{k // 8}), ({n}, {k // GROUP})")
        except (TypeError, ValueError) as exc:
            if packer[0] is quantize_fallback:
                raise
            notes.append(f"{packer[2]}: quantize() does not give (qweight [N,K/8] int32, scales [N,K/128]) ({exc}); "
                         "the fallback packs instead")
            packer = (quantize_fallback, dequantize_fallback,
                      "fallback in benchmarks/decode_e2e.py (the catalog's contract differs)")
            quantized = quantize_weights(weights, packer[0])
    clock.sync()
    result["weights_s"] = round(time.perf_counter() - t, 1)
    result["w4a16_packing"] = packer[2]
    path_ops = {p: make_path(p, cfg, weights, release=release, ops_names=names, quantized=quantized,
                             packer=packer) for p in paths}
    ref4 = w4a16_reference_path(cfg, weights, quantized, packer) if quantized is not None else None
    entry: dict[str, Any] = {"plans": {p: po.plan for p, po in path_ops.items()},
                             "weights_gib": {p: _gib(po.weight_bytes()) for p, po in path_ops.items()}, "cases": {}}
    result["dtypes"][args.dtype] = entry
    for p, po in path_ops.items():
        print(f"{p}: " + "; ".join(f"{k} -> {v['impl']}" for k, v in po.plan.items()), flush=True)
    flush()

    cases = [(int(b), int(s)) for s in args.contexts.split(",") if s for b in args.batches.split(",") if b]
    for batch, capacity in cases:
        name = f"decode_b{batch}_ctx{capacity}"
        if args.deadline_s and time.perf_counter() - t_start > args.deadline_s:
            entry["cases"][name] = {"skipped": f"--deadline-s {args.deadline_s:g} passed before this case started"}
            failures.append(f"{name}: skipped (deadline)")
            flush()
            continue
        try:
            entry["cases"][name] = run_case(args, cfg, path_ops, ref4, release, batch, capacity, modes, clock, roles,
                                            failures)
        except Exception as exc:  # noqa: BLE001  # one case failing (out of memory) must not lose the others
            traceback.print_exc()
            entry["cases"][name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            failures.append(f"{name}: {type(exc).__name__}")
        torch._dynamo.reset()
        if cuda:
            torch.cuda.empty_cache()
        flush()

    if release is not None:
        from tileship.runtime import nojit

        entry["counters_total"] = release.counters()
        result["compile_attempts"] = nojit.attempts()
    flush()
    print(f"wrote {args.out}; {len(failures)} failure(s); {result['seconds']} s")
    for f in failures:
        print("  FAIL", f)
    return 0 if not failures else 1


def run_case(args: argparse.Namespace, cfg: Config, path_ops: Mapping[str, PathOps], ref4: PathOps | None, release: Any,
             batch: int, capacity: int, modes: list[str], clock: Clock, roles: Mapping[str, str],
             failures: list[str]) -> dict[str, Any]:
    import torch

    cuda = clock.cuda
    room = args.decode_room
    plen = capacity - room
    if plen < 1:
        raise ValueError(f"context {capacity} leaves no prompt with --decode-room {room}")
    iters = min(args.iters, room)
    check = batch == args.check_batch
    steps = min(args.check_steps, room)
    dtype_bytes = torch.finfo(getattr(torch, args.dtype)).bits // 8
    layers, layers_note = fit_layers(cfg, batch, capacity, plen, dtype_bytes, cuda)
    prompt = torch.randint(0, cfg.vocab, (batch, plen),
                           generator=torch.Generator().manual_seed(args.seed + 1)).to(args.device)
    name = f"decode_b{batch}_ctx{capacity}"
    case: dict[str, Any] = {"batch": batch, "context": capacity, "prompt": plen, "layers": layers, "iters": iters,
                            "kv_cache_gib": _gib(2 * layers * batch * capacity * cfg.kv_size * dtype_bytes),
                            "paths": {}, "modes": {}, "prefill": {"mode": "eager"}}
    if layers_note:
        case["layers_note"] = layers_note
    if cuda:
        case["torch_sdpa_backends"] = sdpa_backends(cfg, batch, capacity, getattr(torch, args.dtype))
    if iters < args.iters:
        case["iters_note"] = f"--iters {args.iters} > --decode-room {room}: {iters}"
    greedy: dict[str, dict[str, Any]] = {}  # mode -> path -> {"tokens", "logits"}
    for pname, p in path_ops.items():
        pe: dict[str, Any] = {}
        case["paths"][pname] = pe
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            resident = torch.cuda.memory_allocated()
        st = new_state(cfg, batch, capacity, layers, p.weights["embed"].dtype, args.device)
        with torch.inference_mode():
            # prefill: warm up (the whole prompt when small, else a 256-token prefix), then timed
            warm = prompt if batch * plen <= 16384 else prompt[:, : min(plen, 256)]
            prefill(p, cfg, st, warm)
            clock.sync()
            samples, last = [], None
            for _ in range(max(1, args.prefill_repeats)):
                t0 = time.perf_counter() if not cuda else 0.0
                if cuda:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                last = prefill(p, cfg, st, prompt)
                if cuda:
                    end.record()
                    end.synchronize()
                    samples.append(start.elapsed_time(end))
                else:
                    samples.append((time.perf_counter() - t0) * 1e3)
            pe["prefill_ms"] = round(statistics.median(samples), 3)
            pe["prefill_samples_ms"] = [round(s, 3) for s in samples]
            first = st.tokens.clone()
            prefill_logits = last.float().cpu() if check and last is not None else None
            del last
            for mode in modes:
                row = case["modes"].setdefault(mode, {"paths": {}})
                try:
                    pm = run_mode(args, cfg, p, st, mode, plen, first, iters, steps if check else 0, clock, release,
                                  roles)
                except Exception as exc:  # noqa: BLE001  # a compile or capture error: keep the other paths and modes
                    traceback.print_exc()
                    pm = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
                    failures.append(f"{name} {mode} {pname}: {type(exc).__name__}")
                greedy.setdefault(mode, {})[pname] = {"tokens": pm.pop("_tokens", None),
                                                      "logits": pm.pop("_logits", None),
                                                      "prefill_logits": prefill_logits, "first": first}
                pm["prefill_ms"] = pe["prefill_ms"]
                row["paths"][pname] = pm
                if cuda:
                    torch.cuda.empty_cache()
        if cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            own = p.weight_bytes()
            pe["memory"] = {
                "peak_gib": _gib(peak),
                "resident_at_start_gib": _gib(resident),
                "path_weights_gib": _gib(own),
                "peak_path_gib": _gib(peak - resident + own),
                "note": "peak_gib: max_memory_allocated since this path started (every path's weights are resident); "
                "peak_path_gib = peak - resident at start + this path's own weights: what the path alone needs",
            }
            for mode in modes:
                if pname in case["modes"][mode]["paths"]:
                    case["modes"][mode]["paths"][pname]["peak_mem_gib"] = pe["memory"]["peak_path_gib"]
        del st
        if pname == "tileship_w4a16" and check and ref4 is not None:
            case["w4a16_logits"] = w4a16_check(args, cfg, ref4, prompt, plen, capacity, layers, greedy, clock)
            for mode, r in case["w4a16_logits"].items():
                if not r.get("ok"):
                    failures.append(f"{name} {mode}: tileship_w4a16 logits vs the int4 reference: "
                                    f"{r.get('error') or r.get('max_rel_l2')}"
                                    f" > {args.w4a16_tol:g}")
    # the rows: model_e2e's fields plus the W4A16 ones
    for p in ("torch_fp16", "tileship_fp16", "tileship_w4a16"):
        if p in case["paths"] and "prefill_ms" in case["paths"][p]:
            case["prefill"][{"torch_fp16": "torch_ms", "tileship_fp16": "tileship_ms",
                             "tileship_w4a16": "w4a16_ms"}[p]] = case["paths"][p]["prefill_ms"]
    _ratios(case["prefill"])
    for mode, row in case["modes"].items():
        for p, key in (("torch_fp16", "torch_ms"), ("tileship_fp16", "tileship_ms"), ("tileship_w4a16", "w4a16_ms")):
            if "step_ms" in row["paths"].get(p, {}):
                row[key] = row["paths"][p]["step_ms"]
        _ratios(row)
        if check and "torch_fp16" in greedy.get(mode, {}) and "tileship_fp16" in greedy.get(mode, {}):
            row["greedy_match"] = greedy_check(greedy[mode]["torch_fp16"], greedy[mode]["tileship_fp16"], steps)
            if not row["greedy_match"].get("match") and not row["greedy_match"].get("near_tie"):
                failures.append(
                    f"{name} {mode}: tileship_fp16 greedy tokens differ from torch_fp16 ({row['greedy_match']})"
                )
        print(f"{name:22s} {mode:14s} torch {row.get('torch_ms', float('nan')):8.3f} ms  tileship "
              f"{row.get('tileship_ms', float('nan')):8.3f} ms "
              f"(ratio {row.get('ratio', float('nan')):.3f})  w4a16 {row.get('w4a16_ms', float('nan')):8.3f} ms "
              f"(torch/w4a16 {row.get('ratio_w4a16_vs_torch', float('nan')):.3f})", flush=True)
    return case


def _ratios(row: dict[str, Any]) -> None:
    t, f, w = row.get("torch_ms"), row.get("tileship_ms"), row.get("w4a16_ms")
    if t and f:
        row["ratio"] = round(f / t, 4)
        row["ratio_fp16_vs_torch"] = round(t / f, 4)
    if t and w:
        row["ratio_w4a16"] = round(w / t, 4)
        row["ratio_w4a16_vs_torch"] = round(t / w, 4)


def run_mode(args: argparse.Namespace, cfg: Config, p: PathOps, st: State, mode: str, plen: int, first: Any, iters: int,
             steps: int, clock: Clock, release: Any, roles: Mapping[str, str]) -> dict[str, Any]:
    """Compile (or not), capture (or not), check, time and profile one path's decode step in one mode."""
    import torch

    out: dict[str, Any] = {}
    compiled = mode.startswith("compile")
    graphed = mode.endswith("+graph")
    stepper = make_stepper(p, cfg, st, compiled)
    reset(st, plen, first)
    t = time.perf_counter()
    stepper.step()  # compiles the layer and the head on the first call
    clock.sync()
    out["first_step_s" if not compiled else "compile_s"] = round(time.perf_counter() - t, 2)
    if graphed:
        reset(st, plen, first)

        def snapshot() -> Any:
            reset(st, plen, first)
            return release.counters() if release is not None else {}

        replay, logits, before = capture(stepper.step, snapshot)
        out["dispatch_at_capture"] = counters_delta(before, release.counters()) if release is not None else {}

        def run() -> Any:
            replay()
            return logits
    else:
        reset(st, plen, first)
        before = release.counters() if release is not None else {}
        stepper.step()
        out["dispatch_per_step"] = counters_delta(before, release.counters()) if release is not None else {}
        run = stepper.step
    # correctness: a chain of steps from the post-prefill state
    if steps:
        reset(st, plen, first)
        toks, logs = [first.clone()], []
        for i in range(steps):
            lg = run()
            toks.append(st.tokens.clone())
            if i < args.logit_steps or p.name == "torch_fp16":
                logs.append(lg.clone())
        clock.sync()
        out["_tokens"] = torch.stack(toks, dim=1).cpu()
        out["_logits"] = torch.stack(logs, dim=1).float().cpu()
        out["lengths_after_check"] = int(st.lengths[0])
    # timing
    reset(st, plen, first)
    run()
    run()
    samples = []
    for _ in range(max(1, args.repeats)):
        reset(st, plen, first)
        clock.sync()
        samples.append(clock.ms(run, iters))
    step_ms = statistics.median(samples)
    batch = st.tokens.shape[0]
    out.update(step_ms=round(step_ms, 4), tokens_per_s=round(batch * 1e3 / step_ms, 1),
               step_samples_ms=[round(s, 4) for s in samples])
    if args.profile_replays > 0:
        n = min(args.profile_replays, iters)
        reset(st, plen, first)

        def replays(k: int) -> None:
            for _ in range(k):
                run()

        def attribution() -> None:
            reset(st, plen, first)
            stepper.step()

        try:
            out["profile"] = profile_shares(replays, attribution if graphed else None, n, clock.cuda, roles)
        except Exception as exc:  # noqa: BLE001  # the profile is an extra: never lose the timing for it
            out["profile"] = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
    reset(st, plen, first)
    clock.sync()
    return out


def greedy_check(a: Mapping[str, Any], b: Mapping[str, Any], steps: int) -> dict[str, Any]:
    """tokens [B, 1 + steps] of both paths (column 0: the prefill's token).

    match: every token equal. At the first differing (step, row), torch's top-2 logit margin is
    recorded; ``near_tie`` is true when tileship's token is, in torch's own logits, at most two fp16
    ulps below torch's top logit: an exact or near tie that either path may break either way.
    Tokens after the first difference are not compared (each path then feeds its own token).
    """
    ta, tb = a.get("tokens"), b.get("tokens")
    if ta is None or tb is None:
        return {"match": False, "error": "a path produced no tokens"}
    neq = (ta != tb).nonzero()  # [n, 2]: (row, step)
    res: dict[str, Any] = {"steps": steps, "match": not len(neq),
                           "compared": "prefill token + decode steps, batch row 0.. all"}
    if len(neq):
        first = neq[neq[:, 1].argmin()]
        row, i = int(first[0]), int(first[1])
        res["first_mismatch_step"] = i  # 0: the prefill's token
        res["first_mismatch_row"] = row
        lg = a["prefill_logits"] if i == 0 else a["logits"][:, i - 1] if a.get("logits") is not None else None
        if lg is not None:
            lgf = lg.float()
            vals = lgf.topk(2, dim=-1).values
            margin = float(vals[row, 0] - vals[row, 1])
            behind = float(vals[row, 0] - lgf[row, int(tb[row, i])])  # tileship's token in torch's logits
            ulp = 2.0 ** (math.floor(math.log2(max(abs(float(vals[row, 0])), 2.0 ** -14))) - 10)
            res["torch_top2_margin_at_mismatch"] = round(margin, 5)
            res["fp16_ulp_at_top"] = ulp
            res["tileship_token_behind_top"] = round(behind, 5)
            res["near_tie"] = behind <= 2 * ulp
            res["note"] = ("near tie: tileship's token is within 2 fp16 ulps of torch's top logit"
                           if res["near_tie"] else "not a tie: a wrong token")
    return res


def w4a16_check(args: argparse.Namespace, cfg: Config, ref4: PathOps, prompt: Any, plen: int, capacity: int,
                layers: int, greedy: Mapping[str, Mapping[str, Any]], clock: Clock) -> dict[str, Any]:
    """tileship_w4a16's logits (prefill, then --logit-steps decode steps) vs the int4 model on the reference,
    teacher-forced with tileship_w4a16's own tokens, eager."""
    import torch

    out: dict[str, Any] = {}
    st = new_state(cfg, prompt.shape[0], capacity, layers, ref4.weights["embed"].dtype, args.device)
    stepper = make_stepper(ref4, cfg, st, compiled=False)
    with torch.inference_mode():
        ref_prefill = prefill(ref4, cfg, st, prompt).float().cpu()
        for mode, by_path in greedy.items():
            got = by_path.get("tileship_w4a16")
            if not got or got.get("tokens") is None:
                out[mode] = {"ok": False, "error": "tileship_w4a16 produced no tokens"}
                continue
            toks, logs = got["tokens"], got["logits"]
            n = min(args.logit_steps, logs.shape[1])
            reset(st, plen, toks[:, 0].to(args.device))
            errs = [rel_l2(got["prefill_logits"].float().cpu(), ref_prefill)]
            for i in range(n):
                lg = stepper.step().float().cpu()
                errs.append(rel_l2(logs[:, i], lg))
                st.tokens.copy_(toks[:, i + 1].to(args.device))  # teacher forcing: the w4a16 path's own next token
            worst = max(errs)
            out[mode] = {"rel_l2_per_step": [round(e, 6) for e in errs], "max_rel_l2": round(worst, 6),
                         "tolerance": args.w4a16_tol, "ok": worst <= args.w4a16_tol, "steps": n,
                         "reference": "same int4 weights; dequantize + F.linear, F.rms_norm, masked SDPA; eager; step "
                                      "0 = prefill"}
    del st
    clock.sync()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
