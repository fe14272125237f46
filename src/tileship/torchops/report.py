"""What ``swap`` did to a model: one record per candidate layer, replaced or kept, and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SwapRecord:
    """One candidate layer. ``reason``: for a replaced layer, the specializations covering it
    and what they serve now; for one left on PyTorch, why."""

    module: str
    kind: str
    replaced: bool
    operator: str | None
    reason: str
    specs: tuple[str, ...] = ()
    serving: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module, "kind": self.kind, "replaced": self.replaced, "operator": self.operator,
                "reason": self.reason, "specs": list(self.specs), "serving": list(self.serving)}


@dataclass(frozen=True)
class SwapReport:
    release_id: str
    kernel_revision: str
    records: tuple[SwapRecord, ...] = field(default_factory=tuple)

    @property
    def replaced(self) -> list[str]:
        return [r.module for r in self.records if r.replaced]

    @property
    def kept(self) -> dict[str, str]:
        """Layers left on PyTorch -> why."""
        return {r.module: r.reason for r in self.records if not r.replaced}

    def record(self, module: str) -> SwapRecord:
        for r in self.records:
            if r.module == module:
                return r
        raise KeyError(f"{module!r} is not a candidate layer of this model")

    def to_json(self) -> dict[str, Any]:
        return {"release_id": self.release_id, "kernel_revision": self.kernel_revision,
                "replaced": len(self.replaced), "kept": len(self.records) - len(self.replaced),
                "layers": [r.to_json() for r in self.records]}

    def __str__(self) -> str:
        head = (f"release {self.release_id} (kernel revision {self.kernel_revision}): "
                f"{len(self.replaced)} of {len(self.records)} candidate layers replaced")
        lines = [head]
        for r in self.records:
            lines.append(f"  {'replaced' if r.replaced else 'kept    '}  {r.kind:9s} {r.module}: {r.reason}")
        return "\n".join(lines)
