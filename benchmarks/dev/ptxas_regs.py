"""Registers and spills of MMA-GEMV tilings, from ptxas, on a machine without a GPU.

usage: python3 benchmarks/dev/ptxas_regs.py KERNEL M,N,K "rt=4,wn=1,wk=8,unroll=1,prefetch=False" ...

KERNEL is ``w4a16`` (``catalog.w4a16_mma.w4a16_gemm_mv``), ``w4a16_split``
(``catalog.w4a16_mma_split.w4a16_gemm_mv_split``), ``w4a16_wg`` (``catalog.w4a16_wgmma.w4a16_gemm_wg``)
or ``linear`` (``catalog.linear_mma.linear_mv``).
Each tiling is compiled by TileLang for sm_90a with nvcc (cache off) and ``-Xptxas=-v`` added to nvcc's
command line; prints one line a tiling: registers a thread and spill stores / loads in bytes. A tiling
that spills, or whose registers times threads a block exceed 64k, is worth leaving out of a GPU sweep.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

LOG: list[str] = []


class _Popen(subprocess.Popen):  # type: ignore[type-arg]
    """nvcc with ``-Xptxas=-v`` before the source file; keeps what it prints."""

    def __init__(self, cmd: Any, *args: Any, **kwargs: Any) -> None:
        if cmd and str(cmd[0]).endswith("nvcc"):
            cmd = [*cmd[:-1], "-Xptxas=-v", cmd[-1]]
        super().__init__(cmd, *args, **kwargs)

    def communicate(self, *args: Any, **kwargs: Any) -> Any:
        out, err = super().communicate(*args, **kwargs)
        LOG.append(out.decode() if isinstance(out, bytes) else str(out))
        return out, err


def _cfg(text: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {}
    for part in filter(None, text.replace(" ", "").split(",")):
        key, value = part.split("=")
        cfg[key] = {"True": True, "False": False}.get(value, value)
        if isinstance(cfg[key], str):
            cfg[key] = int(value)
    return cfg


def main() -> None:
    import tilelang
    import tilelang.contrib.nvcc as nvcc

    kernel, shape, *tilings = sys.argv[1:]
    if kernel == "w4a16":
        from tileship.catalog.w4a16_mma import w4a16_gemm_mv as make
    elif kernel == "w4a16_split":
        from tileship.catalog.w4a16_mma_split import w4a16_gemm_mv_split as make
    elif kernel == "w4a16_wg":
        from tileship.catalog.w4a16_wgmma import w4a16_gemm_wg as make
    elif kernel == "linear":
        from tileship.catalog.linear_mma import linear_mv as make
    else:
        sys.exit(f"KERNEL must be w4a16, w4a16_split, w4a16_wg or linear, not {kernel!r}")
    tilelang.disable_cache()
    nvcc.subprocess.Popen = _Popen  # type: ignore[misc]
    M, N, K = map(int, shape.split(","))
    for text in tilings:
        LOG.clear()
        try:
            tilelang.compile(make(M, N, K, "float16", **_cfg(text)), out_idx=[-1],
                             target={"kind": "cuda", "arch": "sm_90a"})
        except Exception as exc:  # noqa: BLE001 - a tiling that does not compile is reported, not fatal
            print(f"{text:50s} failed: {str(exc)[-200:]}", flush=True)
            continue
        out = "".join(LOG)
        regs = re.findall(r"Used (\d+) registers", out)
        spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
        print(f"{text:50s} registers {','.join(regs) or '?'} spill {spill or '?'}", flush=True)


if __name__ == "__main__":
    main()
