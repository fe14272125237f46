"""Which descriptor reading makes ``w4a16_wgmma``'s kernel correct on this GPU (GPU host).

usage: python3 benchmarks/dev/wg_probe.py OUT_DIR

Each of the 8 readings (shared layout 0/1 x the descriptor's offset fields as written or swapped x B
transposed 0/1) runs in its own process with a timeout, so that a reading which faults (an address outside
shared memory) or hangs costs only its own process: W4A16 on N = 256, K = 2048 at M = 32 (fp16) with
(wk, ks) = (1, 1), (2, 1) and (1, 2) (no reduction, the in-CTA one, the cluster one), M = 8 with (1, 2), M = 5 and
M = 32 (bf16) with (1, 1), relative L2 error against float32 x @ dequantize(W)^T. Writes ``probe.json`` (every
reading's result) and ``wg_layout.txt`` ("layout,swap,trans" of the first reading correct everywhere, for
``w4a16_sweep.py``'s WG_LAYOUT; absent when none is).
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHILD = r"""
import json, sys, torch, tilelang
sys.path.insert(0, "src")
from tileship.catalog.w4a16 import dequantize, quantize
from tileship.catalog.w4a16_wgmma import w4a16_gemm_wg
lay, swap, tr = (int(v) for v in sys.argv[1].split(","))
torch.manual_seed(0)
N, K = 256, 2048
w = torch.randn(N, K, device="cuda", dtype=torch.float16) * 0.02
qw, sc = quantize(w)
wdq = dequantize(qw, sc).float()
res = []
for M, dt, wk, ks in ((32, "float16", 1, 1), (32, "float16", 2, 1), (32, "float16", 1, 2), (8, "float16", 1, 2),
                      (5, "float16", 1, 1), (32, "bfloat16", 1, 1)):
    if True:
        tdt = getattr(torch, dt)
        x = torch.randn(M, K, device="cuda", dtype=tdt)
        kern = tilelang.compile(w4a16_gemm_wg(M, N, K, dt, wk=wk, ks=ks, unroll=2, layout=lay, swap_fields=bool(swap),
                                              trans=tr), out_idx=[3], target={"kind": "cuda", "arch": "sm_90a"},
                                pass_configs={"tl.disable_warp_specialized": True})
        y = kern(x, qw, sc.to(tdt))
        torch.cuda.synchronize()
        ref = x.float() @ wdq.t()
        res.append(dict(M=M, dtype=dt, wk=wk, ks=ks, relerr=((y.float() - ref).norm() / ref.norm()).item()))
print("RESULT " + json.dumps(res))
"""


def probe(reading: str) -> dict:
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, reading], capture_output=True, text=True, timeout=130)
    except subprocess.TimeoutExpired:
        return dict(reading=reading, error="timed out after 130 s (a hang)")
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return dict(reading=reading, error=f"rc {p.returncode}: {(p.stderr or p.stdout)[-600:]}")
    cases = json.loads(line[7:])
    return dict(reading=reading, cases=cases, ok=all(c["relerr"] < 2e-2 for c in cases))


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    readings = [f"{lay},{swap},{tr}" for tr in (0, 1) for lay in (0, 1) for swap in (0, 1)]
    with ThreadPoolExecutor(max_workers=8) as ex:
        results = list(ex.map(probe, readings))
    for r in results:
        cases = r.get("cases") or []
        errs = " ".join(f"M{c['M']}{c['dtype'][0]}/{c['wk']}{c['ks']}:{c['relerr']:.1e}" for c in cases)
        print(f"reading {r['reading']}: {'OK' if r.get('ok') else 'wrong'} {errs or r.get('error', '')[-300:]}",
              flush=True)
    (out / "probe.json").write_text(json.dumps(results, indent=1))
    good = [r["reading"] for r in results if r.get("ok")]
    if good:
        (out / "wg_layout.txt").write_text(good[0] + "\n")
        print(f"WG_LAYOUT={good[0]}", flush=True)
    else:
        print("no reading is correct everywhere", flush=True)


if __name__ == "__main__":
    main()
