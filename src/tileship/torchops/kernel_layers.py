"""The layers ``swap`` puts in place of PyTorch's: ``KernelLinear`` (``nn.Linear`` through a GEMM),
``KernelRMSNorm`` and ``KernelAttention``, each calling its release operator through an ``EagerOp``
(or any callable with the operator's signature). ``tileship.torchops.swap`` re-exports them.
Keys the operator sends to the reference run the replaced layer's own PyTorch code (``_Bypassing``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class _Bypassing(nn.Module):
    """A swapped layer that serves the keys its operator sends to the reference with the PyTorch code
    of the layer it replaced (``_native``), at that layer's cost: no reshape, no dispatcher on the way.
    Such a call is still counted in the operator's telemetry under the key's reason
    (``OpRunner.serve_reference``). The decision is memoized per input key (``_reference_hit``) with the
    runner it came from (at most ``_ROUTES_LIMIT`` keys); a new runner (the release registered again),
    a new op, moving the layer, a copy or a pickle start a new memo. Only an op with
    ``reference_route`` (an ``EagerOp``) is asked; under ``torch.compile`` or autograd every call
    goes through the op."""

    _native: bool
    _eager: bool
    _op: Any
    #: input key -> (runner, its reference route or None): see the class doc
    _routes: dict[tuple[Any, ...], tuple[Any, Any]]

    def _reference_hit(self, key: tuple[Any, ...], *inputs: torch.Tensor) -> tuple[Any, Any] | None:
        """(runner, route) when the forward's ``inputs`` (memo key ``key``) go to the reference, else
        None (the op serves them). A layer with parameters keys on the input's (shape, dtype): its
        parameters fix the device (an input on another fails in the replaced layer's own call as in
        the op's), and moving the layer (``to``, ``cuda``, ``half``) clears the memo. Called only
        while ``_eager`` (the forwards check it before making the key)."""
        if torch.compiler.is_compiling():
            return None
        hit = self._routes.get(key)
        if hit is None or hit[0] is not self._op.current():
            if hit is not None:  # the op serves another runner now: forget the old one's routes
                self._routes = {}
            hit = self._op.reference_route(*self._op_args(*inputs))
            if hit is not None and len(self._routes) < _ROUTES_LIMIT:
                self._routes[key] = hit
        return hit if hit is not None and hit[1] is not None else None

    def _op_args(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The operator's arguments for the forward's ``inputs``, as the forward passes them."""
        raise NotImplementedError

    @property
    def op(self) -> Any:
        """What serves the layer: an ``EagerOp`` (or any callable with the operator's signature).
        Setting it clears the memo."""
        return self._op

    @op.setter
    def op(self, op: Any) -> None:
        self._op = op
        self._eager = self._native and hasattr(op, "reference_route")
        self._routes = {}

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self._routes = {}  # the parameters move (device, dtype): routes learned before may not hold
        return super()._apply(fn, *args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles start with an empty memo (it holds live runners)."""
        state = super().__getstate__()
        return {**state, "_routes": {}}


#: input keys a swapped layer memoizes (a model calls a handful: one per batch size)
_ROUTES_LIMIT = 64


class KernelLinear(_Bypassing):
    """``nn.Linear`` through the release's GEMM. Keeps ``weight``/``bias`` (same parameters,
    same state-dict keys) plus ``weight_t``, the weight in the operator's layout (not saved; refreshed
    on ``load_state_dict``; call ``refresh()`` after replacing ``weight``): for a GEMM declared
    ``A(M, K), B(K, N)`` a contiguous W^T made once (the weight then exists twice in memory); for an
    operator declared in ``F.linear``'s layout, ``X(M, K), W(N, K)`` (``nn_layout``), a detached alias
    of the weight itself, no copy.

    In eager mode, an input whose key the dispatcher sends to the reference (a decode batch the
    evidence routes to PyTorch, an undeclared size, a CPU tensor) runs ``F.linear`` on the layer's
    own parameters, which is what the ``nn.Linear`` it replaced ran: the reference's answer
    (y = x W^T + b) at the cost of the PyTorch layer (see ``_Bypassing``)."""

    _native = True

    def __init__(self, linear: nn.Linear, op: Any, *, nn_layout: bool = False) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.nn_layout = nn_layout
        self.register_buffer("weight_t", self._operand(), persistent=False)
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hit = self._reference_hit((x.shape, x.dtype), x) if self._eager else None
        if hit is not None:
            return hit[0].serve_reference(hit[1], F.linear, (x, self.weight, self.bias))
        y = self.op(x.reshape(-1, self.in_features), self.weight_t).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def _op_args(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return inputs[0].reshape(-1, self.in_features), self.weight_t

    def _operand(self) -> torch.Tensor:
        w = self.weight.detach()
        return w if self.nn_layout else w.t().contiguous()

    @torch.no_grad()
    def refresh(self) -> None:
        self.weight_t = self._operand()

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self.refresh()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, nn_layout={self.nn_layout}, op={self.op}")


class KernelRMSNorm(_Bypassing):
    """RMSNorm over the last dim through the release's rmsnorm (its eps was checked at swap).

    ``native``: the layer replaced runs ``F.rms_norm`` (``nn.RMSNorm``, tileship's ``RMSNorm``), so
    reference-routed keys run ``F.rms_norm`` on this layer's weight and eps (see ``_Bypassing``).
    Another norm class (swap's ``rmsnorm_types``) may compute differently: all its calls go through
    the operator."""

    def __init__(self, weight: nn.Parameter, eps: float, op: Any, *, native: bool = False) -> None:
        super().__init__()
        self.weight = weight
        self.eps = eps
        self._native = native
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        hit = self._reference_hit((x.shape, x.dtype), x) if self._eager else None
        if hit is not None:
            return hit[0].serve_reference(hit[1], F.rms_norm, (x, (n,), self.weight, self.eps))
        y = self.op(x.reshape(-1, n), self.weight)
        # a contiguous (M, N) output (the kernel's and the catalog reference's) takes x's shape with
        # ``view_as``: ``reshape(x.shape)`` does the same through torch's slower parsing of a Size
        # argument (3-4 us a call on the CPU machine, twice per decoder layer in eager mode)
        return y.view_as(x) if y.is_contiguous() else y.reshape(x.shape)

    def _op_args(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return inputs[0].reshape(-1, inputs[0].shape[-1]), self.weight

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, op={self.op}"


class KernelAttention(_Bypassing):
    """Causal attention on (B, H, S, D) through the release's attention. Inputs are made
    contiguous (the kernel's requirement; after rotary embeddings on a transposed view they
    are not), so a non-contiguous call does not fall back for layout alone.

    ``native``: the layer replaced is tileship's ``CausalSelfAttention`` (causal SDPA), so
    reference-routed keys run ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` on the
    inputs as given (see ``_Bypassing``); another attention class's calls all go through the operator."""

    def __init__(self, n_heads: int, head_dim: int, op: Any, *, native: bool = False) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = head_dim
        self._native = native
        self.op = op

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        same = k.shape == q.shape == v.shape and k.dtype == q.dtype == v.dtype and k.device == q.device == v.device
        hit = self._reference_hit((q.shape, q.dtype, q.device), q, k, v) if self._eager and same else None
        if hit is not None:
            return hit[0].serve_reference(hit[1], _causal_sdpa, (q, k, v))
        return self.op(q.contiguous(), k.contiguous(), v.contiguous())

    def _op_args(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(t.contiguous() for t in inputs)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, head_dim={self.head_dim}, op={self.op}"


def _causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


__all__ = ["KernelAttention", "KernelLinear", "KernelRMSNorm"]
