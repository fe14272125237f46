"""What a runner reports, read-only: its calls by path and reason, its launchers, valid sample inputs.

A mixin of ``dispatch.OpRunner``, which holds the state these read (``entries``, ``telemetry``,
``_memo``, ``shape``, ``sample``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tileship.runtime.route as rt
from tileship.runtime.decision import KERNEL, REFERENCE


class RunnerInfo:
    """Views over an ``OpRunner``'s state; nothing here changes it."""

    entries: Any
    telemetry: Any
    shape: Any
    sample: Any
    _memo: Any

    def sample_inputs(self, dims: Mapping[str, int], dtype: str, device: str, seed: int) -> list[Any]:
        """Valid inputs at base ``dims`` for a specialization of ``dtype``: each with its declared
        dtype, from the operator's ``sample`` hook when it has one (demo, warm-up, benchmarks)."""
        from tileship.declare.inputs import make_inputs

        return make_inputs(self.shape.inputs, dims, dtype, device, seed, dtypes=self.shape.dtypes or None,
                           sample=self.sample, scalars=self.shape.scalars)

    def launchers(self) -> dict[str, str]:
        """Per memoized key a kernel serves: its launcher (``ctypes``, ``tvm_ffi``, ...) or ``adapter: <why>``."""
        return rt.describe(self._memo)

    def snapshot(self) -> dict[str, int]:
        """Calls so far by ``path:reason``."""
        counts = {(REFERENCE, reason): n for reason, n in self.telemetry.calls_by_reason().items() if n}
        n = sum(e.kernel_calls() for e in self.entries)
        if n:
            counts[(KERNEL, KERNEL)] = n
        return {f"{p}:{r}": v for (p, r), v in sorted(counts.items())}


__all__ = ["RunnerInfo"]
