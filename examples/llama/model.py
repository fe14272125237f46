"""A Llama-style decoder in plain PyTorch: the eager reference the kernels are measured against.

Pre-norm blocks of RMSNorm -> causal self-attention (rotary embeddings, separate q/k/v
projections, SDPA) -> RMSNorm -> SwiGLU MLP, then a final RMSNorm and the LM head. No KV
cache: ``forward(ids)`` runs every position of ``ids`` (a decode step is therefore a
one-token forward, see docs/pytorch.md). Weights are random with a realistic scale
(std 1/sqrt(fan_in)), so activations stay O(1) through the layers and numerical
comparisons mean something.

Each piece ``tileship.torchops.swap`` can replace is its own module: ``nn.Linear`` projections,
``RMSNorm`` (which calls ``torch.nn.functional.rms_norm``, the catalog's reference), and
``CausalSelfAttention`` (the SDPA core on (B, H, S, D), the catalog attention's contract); the
last two come from ``tileship.torchops.layers``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from tileship.torchops.layers import CausalSelfAttention, RMSNorm


@dataclass(frozen=True)
class LlamaConfig:
    """Sizes of the decoder. The defaults are Llama-2-7B's, with fewer layers."""

    vocab_size: int = 32000
    hidden: int = 4096
    n_layers: int = 2
    n_heads: int = 32
    intermediate: int = 11008
    max_seq: int = 4096
    eps: float = 1e-6
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden", "n_layers", "n_heads", "intermediate", "max_seq"):
            if getattr(self, name) < 1:
                raise ValueError(f"LlamaConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.n_heads:
            raise ValueError(f"LlamaConfig.hidden ({self.hidden}) must be a multiple of n_heads ({self.n_heads})")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig head_dim ({self.head_dim}) must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads


def rope_tables(cfg: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, (max_seq, head_dim) float32, computed in float64."""
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64, device="cpu") / cfg.head_dim))
    angles = torch.outer(torch.arange(cfg.max_seq, dtype=torch.float64, device="cpu"), inv)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().float(), angles.sin().float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.head_dim
        # three separate projections (not one fused qkv) so each is a hidden x hidden GEMM
        self.q_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.o_proj = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.core = CausalSelfAttention(cfg.n_heads, cfg.head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        o = self.core(_rotate(q, cos, sin), _rotate(k, cos, sin), v)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden, cfg.eps)
        self.attn = Attention(cfg)
        self.post_attn_norm = RMSNorm(cfg.hidden, cfg.eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), cos, sin)
        return x + self.mlp(self.post_attn_norm(x))


class Llama(nn.Module):
    """``forward(ids: (batch, seq) int64) -> logits (batch, seq, vocab)``; seq <= max_seq."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg)
        # derived from the config, never trained: not part of the state_dict
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        s = ids.shape[1]
        x = self.embed(ids)
        cos = self.rope_cos[:s].to(x.dtype)
        sin = self.rope_sin[:s].to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


@torch.no_grad()
def random_llama(cfg: LlamaConfig, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 seed: int = 0) -> Llama:
    """A model with seeded random weights: linears N(0, 1/fan_in), embeddings N(0, 1), norm
    weights 1 + N(0, 0.1) (not all ones, so a kernel ignoring the weight is caught).

    Built on the meta device and materialized once on ``device``: a 7B-sized layer never
    exists twice. The same ``(cfg, seed)`` gives the same weights on every device.
    """
    with torch.device("meta"):
        model = Llama(cfg)
    model = model.to_empty(device=device)
    g = torch.Generator(device="cpu").manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        elif name == "embed.weight":
            w = torch.randn(p.shape, generator=g)
        else:
            w = torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1])
        p.copy_(w)
    cos, sin = rope_tables(cfg)  # to_empty left the buffers uninitialized
    model.rope_cos.copy_(cos)
    model.rope_sin.copy_(sin)
    return model.to(dtype=dtype).eval()
