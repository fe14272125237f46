#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/gpu_verify.sh RELEASE_DIR OUT_DIR
#   1) tileship verify RELEASE_DIR (writes RELEASE_DIR/evidence/verification.json, re-hashes the manifest)
#   2) tileship report -> OUT_DIR/report/index.html + PNGs
#   3) served vs best per declared shape (routing=evidence) -> OUT_DIR/served_vs_best.{json,txt}
# OUT_DIR/release-evidence/ gets the two files that change in the release (evidence + manifest):
# copy them into the same release elsewhere and it stays intact (the release id does not change).
# Knobs: VERIFY_ARGS (e.g. "--device cuda --grid 2"), SVB_ARGS (e.g. "--budget-ms 100").
set -u
rel=${1:?usage: gpu_verify.sh RELEASE_DIR OUT_DIR}
out=${2:?usage: gpu_verify.sh RELEASE_DIR OUT_DIR}
mkdir -p "$out/release-evidence"
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$out/nvidia-smi.csv"

t0=$(date +%s)
# shellcheck disable=SC2086
python3 -m tileship.cli verify "$rel" --json-out "$out/verification.json" ${VERIFY_ARGS:-} > "$out/verify.log" 2>&1
vrc=$?
echo "verify rc=$vrc ($(( $(date +%s) - t0 )) s; 0 all passed, 2 some failed, 1 could not run)"
grep -E "^(failed|skipped)|^device:|^evidence written|signature" "$out/verify.log" | head -40
cp "$rel/evidence/verification.json" "$rel/manifest.json" "$out/release-evidence/" 2>/dev/null

t0=$(date +%s)
python3 -m tileship.cli report "$rel" --out "$out/report" > "$out/report.log" 2>&1
echo "report rc=$? ($(( $(date +%s) - t0 )) s)"

t0=$(date +%s)
# shellcheck disable=SC2086
python3 benchmarks/served_vs_best.py "$rel" --routing evidence --out "$out/served_vs_best.json" ${SVB_ARGS:-} \
  > "$out/served_vs_best.txt" 2>&1
echo "served_vs_best rc=$? ($(( $(date +%s) - t0 )) s; 1 = some shape over 1.05x)"
grep -E "over target|shapes within|^note" "$out/served_vs_best.txt" | tail -40
exit "$vrc"
