#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/dev/gpu_round15b.sh OUT_DIR   (issue 13, round 15, call 2)
# Does the latency clock make tune's decisions reproducible, and what does served_vs_best say then?
# 1. build benchmarks/tuned/tileship.toml on the host;
# 2. clock_methods.py --shapes quick (the latency clock and its parts beside the other methods);
# 3. tileship tune --clock events (as before), then --clock latency twice, each in its own process,
#    keeping each run's evidence (tune_{events,latency1,latency2}.json); tune_agreement.py between them;
# 4. served_vs_best.py --routing evidence on the last table.
set -u
out=${1:?usage: gpu_round15b.sh OUT_DIR}
mkdir -p "$out"
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$out/nvidia-smi.csv"
t0=$(date +%s)
timeout 120 python3 -m tileship.cli build --project benchmarks/tuned/tileship.toml --out /tmp/tuned-rel -j 16 \
  > "$out/build.log" 2>&1
echo "build rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 "$out/build.log"
rel=$(ls -td /tmp/tuned-rel/*/ | head -1)
t1=$(date +%s)
timeout 50 python3 benchmarks/dev/clock_methods.py "$rel" "$out/clock_methods.json" --rounds 3 --shapes quick \
  > "$out/clock_methods.txt" 2>&1
echo "clock_methods rc=$? ($(( $(date +%s) - t1 )) s)"
for run in events latency1 latency2; do
  t1=$(date +%s)
  timeout 110 python3 -m tileship.cli tune "$rel" --budget-ms 20 --clock "${run%[0-9]}" > "$out/tune_$run.log" 2>&1
  echo "tune $run rc=$? ($(( $(date +%s) - t1 )) s)"; tail -1 "$out/tune_$run.log"
  cp "$rel/evidence/verification.json" "$out/tune_$run.json" 2>/dev/null
done
python3 benchmarks/dev/tune_agreement.py "$out/tune_latency1.json" "$out/tune_latency2.json" > "$out/agreement.txt" 2>&1
python3 benchmarks/dev/tune_agreement.py "$out/tune_events.json" "$out/tune_latency2.json" >> "$out/agreement.txt" 2>&1
grep "buckets routed" "$out/agreement.txt"
t1=$(date +%s)
timeout 95 python3 benchmarks/served_vs_best.py "$rel" --routing evidence --out "$out/served_vs_best_evidence.json" \
  --budget-ms 15 > "$out/served_vs_best_evidence.txt" 2>&1
echo "served_vs_best evidence rc=$? ($(( $(date +%s) - t1 )) s)"; tail -2 "$out/served_vs_best_evidence.txt"
echo "total $(( $(date +%s) - t0 )) s"
tar -C "$out" -czf /tmp/all.tgz . && mv /tmp/all.tgz "$out/all.tgz"
