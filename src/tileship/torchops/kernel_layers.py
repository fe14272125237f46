"""The layers ``swap`` puts in place of PyTorch's: ``KernelLinear`` (``nn.Linear`` through a GEMM),
``KernelRMSNorm`` and ``KernelAttention``, each calling its release operator through an ``EagerOp``
(or any callable with the operator's signature). ``tileship.torchops.swap`` re-exports them."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class KernelLinear(nn.Module):
    """``nn.Linear`` through the release's GEMM. Keeps ``weight``/``bias`` (same parameters,
    same state-dict keys) plus ``weight_t``, a contiguous W^T made once (not saved; refreshed
    on ``load_state_dict``; call ``refresh()`` after editing ``weight`` in place).

    In eager mode, an input whose key the dispatcher sends to the reference (a decode batch the
    evidence routes to PyTorch, an undeclared size, a CPU tensor) runs ``F.linear`` on the layer's
    own parameters, which is what the ``nn.Linear`` it replaced ran: the reference's answer (y = x W^T
    + b) at the cost of the PyTorch layer, with no reshape, no W^T product and no dispatcher on the
    way. The call is still counted in the operator's telemetry under the key's reason
    (``OpRunner.serve_reference``). The decision is memoized per input (shape, dtype, device) with
    the runner it came from; a new runner (the release registered again) or a key that a kernel
    serves goes through the operator as before."""

    def __init__(self, linear: nn.Linear, op: Any) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.register_buffer("weight_t", linear.weight.detach().t().contiguous(), persistent=False)
        #: (shape, dtype, device) -> (runner, its reference route or None): see the class doc
        self._routes: dict[tuple[Any, ...], tuple[Any, Any]] = {}
        self.op = op

    @property
    def op(self) -> Any:
        """What serves the layer: an ``EagerOp`` (or any callable taking (x2d, W^T)). Setting it
        clears the memo; only an op with ``reference_route`` (an EagerOp) is asked about the reference."""
        return self._op

    @op.setter
    def op(self, op: Any) -> None:
        self._op = op
        self._eager = hasattr(op, "reference_route")
        self._routes = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._eager and not torch.compiler.is_compiling():
            key = (x.shape, x.dtype, x.device)
            hit = self._routes.get(key)
            if hit is None or hit[0] is not self.op.current():
                if hit is not None:  # the op serves another runner now: forget the old one's routes
                    self._routes = {}
                hit = self._learn(x, key)
            if hit is not None and hit[1] is not None:
                return hit[0].serve_reference(hit[1], F.linear, (x, self.weight, self.bias))
        y = self.op(x.reshape(-1, self.in_features), self.weight_t).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def _learn(self, x: torch.Tensor, key: tuple[Any, ...]) -> tuple[Any, Any] | None:
        """Ask the operator how it serves ``x`` (memo key ``key``), and memoize the answer (bounded)."""
        hit = self.op.reference_route(x.reshape(-1, self.in_features), self.weight_t)
        if hit is not None and len(self._routes) < _ROUTES_LIMIT:
            self._routes[key] = hit
        return hit

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles start with an empty memo (it holds live runners)."""
        state = super().__getstate__()
        return {**state, "_routes": {}}

    @torch.no_grad()
    def refresh(self) -> None:
        self.weight_t = self.weight.detach().t().contiguous()

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self.refresh()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, op={self.op}")


#: input keys a KernelLinear memoizes (a model calls a handful: one per batch size)
_ROUTES_LIMIT = 64


class KernelRMSNorm(nn.Module):
    """RMSNorm over the last dim through the release's rmsnorm (its eps was checked at swap)."""

    def __init__(self, weight: nn.Parameter, eps: float, op: Any) -> None:
        super().__init__()
        self.weight = weight
        self.eps = eps
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.op(x.reshape(-1, x.shape[-1]), self.weight)
        # a contiguous (M, N) output (the kernel's and the catalog reference's) takes x's shape with
        # ``view_as``: ``reshape(x.shape)`` does the same through torch's slower parsing of a Size
        # argument (3-4 us a call on the CPU machine, twice per decoder layer in eager mode)
        return y.view_as(x) if y.is_contiguous() else y.reshape(x.shape)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, op={self.op}"


class KernelAttention(nn.Module):
    """Causal attention on (B, H, S, D) through the release's attention. Inputs are made
    contiguous (the kernel's requirement; after rotary embeddings on a transposed view they
    are not), so a non-contiguous call does not fall back for layout alone."""

    def __init__(self, n_heads: int, head_dim: int, op: Any) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.op = op

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.op(q.contiguous(), k.contiguous(), v.contiguous())

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, head_dim={self.head_dim}, op={self.op}"


__all__ = ["KernelAttention", "KernelLinear", "KernelRMSNorm"]
