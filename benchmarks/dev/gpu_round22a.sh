#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round22a.sh OUT_DIR   (issue 13, round 22, call 1)
# Option B's loop with the forced-slow canary, the canary now on gated device spans (f0cf8c1: a spin holds the
# device while the call's launches queue; the dispatcher starts and stops the span before the non-finite check).
# Round 21 compared 0.2932 vs 0.2983 ms (1.02x) for tiles that take 20-45 us alone, and promoted the slow copy.
# The server's log (every request's spans: device_ms, or device_stalled_ms when the queuing outlasted the gate)
# comes back too. Needs .gpu/site.tar.xz and .gpu/serve.tar.xz carried. OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round22a.sh OUT_DIR}
d=/tmp/round22a; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
[ -d /tmp/serve/uvicorn ] || { mkdir -p /tmp/serve && tar -C /tmp/serve -xJf .gpu/serve.tar.xz; }
export PYTHONPATH=/tmp/serve:$PYTHONPATH
t1=$(date +%s)
rm -rf /tmp/loop
timeout 300 python3 benchmarks/option_b_loop.py --device cuda --rollback --workdir /tmp/loop --out "$d/loop.json" \
  > "$d/loop.log" 2>&1
echo "option_b_loop rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "^\[(result|canary|load)" "$d/loop.log" | cut -c1-240
python3 -c "import json; d = json.load(open('$d/loop.json'))
for k in ('canary', 'rollback'):
    for x in (d.get(k) or {}).get('decisions', [])[-1:]:
        print(k, x['action'], json.dumps(x['numbers']['models'])[:400])" 2>&1
[ -f /tmp/loop/serve.log ] && xz -c /tmp/loop/serve.log > "$d/serve.log.xz"
python3 - "$d" <<'PY' 2>&1
import json, lzma, statistics, sys
from collections import defaultdict
rows = defaultdict(list); stalled = defaultdict(int)
for line in lzma.open(sys.argv[1] + "/serve.log.xz", "rt"):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    sp = e.get("spans") or {}
    key = (e.get("version"), e.get("spec"))
    if "device_ms" in sp:
        rows[key].append(sp["device_ms"])
    if "device_stalled_ms" in sp:
        stalled[key] += 1
for k in sorted(set(rows) | set(stalled), key=str):
    v = rows.get(k, [])
    print("spans", k, "n", len(v), "stalled", stalled.get(k, 0),
          "device_ms p50", round(statistics.median(v), 4) if v else None, "min", min(v) if v else None)
PY
echo "total $SECONDS s"
