#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round25b.sh OUT_DIR   (issue 12; prepared in round 25, not yet run)
# The fp16 decode path with the 16-bit MMA-GEMV as tune candidates of `linear` (catalog/linear_mma.py):
# build benchmarks/decode/fp16.toml; tileship verify --grid 2 of everything but linear's fp16 M=4..16 groups
# (bf16 left out for time); tileship tune of those groups (each candidate verified against float64, then
# timed as served against F.linear, the winner recorded only beyond the noise); the tuned table printed
# per shape; then decode_e2e (compile + CUDA graph) at context 1k, batches 8 and 1, torch fp16 vs tileship
# fp16, with the time left. Needs .gpu/site.tar.xz carried. OUT_DIR/all.tgz.
set -u
out=${1:?usage: gpu_round25b.sh OUT_DIR}
d=/tmp/round25b; rm -rf "$d"; mkdir -p "$d" "$out"
finish() { tar -C "$d" -czf "$out/all.tgz" .; }
trap finish EXIT
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
t0=$(date +%s)
rm -rf /tmp/fp16-rel
python3 -m tileship.cli build --project benchmarks/decode/fp16.toml --out /tmp/fp16-rel -j 16 > "$d/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$d/build.log"
rel=$(ls -d /tmp/fp16-rel/*/ | head -1)
# --only lists: the groups to tune (linear, fp16, M = 4..16) and every other fp16 specialization to verify
python3 - "$rel" "$d" <<'PY'
import json, sys
rel = json.load(open(sys.argv[1] + "/release.json"))
tune, verify = set(), []
for sid, info in rel["specializations"].items():
    s = info["spec"]
    dims = dict(s["dims"]) if isinstance(s["dims"], list) else s["dims"]
    if s["dtype"] != "float16":
        continue
    if s["op"] == "linear" and 4 <= dims.get("M", 0) <= 16:
        tune.add(sid.rsplit(".", 1)[0] if s.get("candidate") else sid)
    else:
        verify.append(sid)
open(sys.argv[2] + "/tune_only.txt", "w").write("\n".join(sorted(tune)) + "\n")
open(sys.argv[2] + "/verify_only.txt", "w").write("\n".join(sorted(verify)) + "\n")
print(f"{len(tune)} groups to tune, {len(verify)} specializations to verify")
PY
t1=$(date +%s)
mapfile -t vonly < <(sed 's/^/--only\n/' "$d/verify_only.txt")
timeout "${VERIFY_TIMEOUT:-150}" python3 -m tileship.cli verify "$rel" --json-out "$d/verification.json" --grid 2 \
  "${vonly[@]}" > "$d/verify.log" 2>&1
echo "verify rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "passed|failed|evidence written" "$d/verify.log" | tail -3
t1=$(date +%s)
mapfile -t tonly < <(sed 's/^/--only\n/' "$d/tune_only.txt")
timeout "${TUNE_TIMEOUT:-200}" python3 -m tileship.cli tune "$rel" "${tonly[@]}" > "$d/tune.log" 2>&1
echo "tune rc=$? ($(( $(date +%s) - t1 )) s)"
cp "$rel/evidence/verification.json" "$d/evidence.json" 2>/dev/null
python3 - "$d/evidence.json" <<'PY' 2>&1
import json, sys
ev = json.load(open(sys.argv[1]))
for gid, g in sorted(ev.get("tuning", {}).items()):
    for p in g["points"]:
        ref = p["reference"]["median_us"]
        meds = {c: v.get("median_us") for c, v in p["candidates"].items() if v.get("passed")}
        failed = [c for c, v in p["candidates"].items() if not v.get("passed")]
        line = " ".join(f"{c.replace('mv_', '')}={m:.1f}" for c, m in meds.items() if m is not None)
        print(f"{gid[:48]:48s} F.linear {ref:7.1f} us | {line} | winner {p['winner']} noise {p['noise_us']:.2f}"
              f"{' | failed ' + ','.join(failed) if failed else ''}")
PY
left=$(( ${DEADLINE_S:-585} - SECONDS ))  # DEADLINE_S: a shorter call when device time is short
if [ "$left" -gt 90 ]; then
  t1=$(date +%s)
  timeout "$left" python3 benchmarks/decode_e2e.py --release "$rel" --out "$d/decode_e2e_1k.json" --contexts 1024 \
    --batches 8,1 --paths torch_fp16,tileship_fp16 --rms-eps 1e-6 --require-evidence --deadline-s $(( left - 20 )) \
    > "$d/decode_e2e_1k.log" 2>&1
  echo "decode_e2e 1k rc=$? ($(( $(date +%s) - t1 )) s)"; grep -E "ratio|FAIL" "$d/decode_e2e_1k.log" | cut -c1-300 | tail -8
fi
xz -9 "$d/verification.json" "$d/verify.log" "$d/evidence.json" 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
