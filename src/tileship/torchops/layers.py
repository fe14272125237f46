"""The layers ``swap`` recognises besides ``nn.Linear`` and ``nn.RMSNorm``: plain-PyTorch modules whose
contract is the catalog operators' (use them in a model to have those layers run on kernels).

    RMSNorm              y = x * rsqrt(mean(x^2) + eps) * weight over the last dim  -> rmsnorm
    CausalSelfAttention  causal SDPA core on (batch, heads, seq, head_dim)          -> attention

The Llama example (``examples/llama``) is built from them.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    """y = x * rsqrt(mean(x^2) + eps) * weight over the last dim (``F.rms_norm``)."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class CausalSelfAttention(nn.Module):
    """softmax(q k^T / sqrt(D) + causal mask) v on (batch, heads, seq, head_dim) tensors."""

    def __init__(self, n_heads: int, head_dim: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = head_dim

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


__all__ = ["CausalSelfAttention", "RMSNorm"]
