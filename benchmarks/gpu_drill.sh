#!/usr/bin/env bash
# GPU host, repo root:  bash benchmarks/gpu_drill.sh OUT_DIR RELEASE_N [RELEASE_N_MINUS_1]
#
# 1) rollback drill: publish the CUDA release(s) into a fresh registry (OUT/registry), start
#    `tileship serve` on it, keep a bounded load running and switch N -> N-1 -> reference -> N
#    (tileship drill). With one release, N-1 is a copy of it with another model version (a
#    different release id, the same kernels): the switch path is the same.
#    Writes OUT/drill/{drill.json,drill.txt,server.log,metrics.txt}.
# 2) sticky CUDA error recovery (benchmarks/gpu_fault_recovery.py): builds the fault-injection
#    kernel with nvcc, poisons a worker, restarts it, times it. Writes OUT/fault/fault_recovery.{json,txt}
#    and the diagnostics bundle written by the poisoned worker (OUT/fault/diagnostics/).
# Env: PHASE_SECONDS (10), CONCURRENCY (8), SERVER_ARG (more `tileship serve` flags, space-separated), ALLOW_UNVERIFIED (1: run kernels of releases without
#      verification evidence; every answer is still checked against the reference), FAULT (1: run step 2),
#      RESTARTS (3), SITE (/tmp/site: where the offline bundle .gpu/site.tar.xz is unpacked).
set -u
out=$1; rel_n=$2; rel_old=${3:-}
site=${SITE:-/tmp/site}
mkdir -p "$site" "$out" && { [ ! -f .gpu/site.tar.xz ] || tar -C "$site" -xJf .gpu/site.tar.xz; }
export PYTHONPATH=$site:$PWD/src${PYTHONPATH:+:$PYTHONPATH} TILELANG_CACHE_DIR=/tmp/tlcache TILESHIP_HOME=$out/home
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
PY=$(command -v python3)
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv > "$out/nvidia-smi.csv" 2>&1
reg=$out/registry
rm -rf "$reg"

if [ -z "$rel_old" ]; then
  rel_old=$out/variant-n-minus-1
  rm -rf "$rel_old"; cp -r "$rel_n" "$rel_old"
  "$PY" - "$rel_old" <<'EOF'
import json, sys
from pathlib import Path
from tileship.release import bundle
root = Path(sys.argv[1])
rel = json.loads((root / "release.json").read_text())
rel["model"]["version"] = str(rel["model"]["version"]) + "-previous"
(root / "release.json").write_text(json.dumps(rel, indent=2, sort_keys=True) + "\n")
print("N-1 variant:", bundle.write_manifest(root)["release_id"])
EOF
fi

"$PY" -m tileship.cli publish "$rel_old" --registry "$reg" || exit 1
"$PY" -m tileship.cli publish "$rel_n" --registry "$reg" || exit 1
old_id=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]+'/manifest.json'))['release_id'])" "$rel_old")
new_id=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]+'/manifest.json'))['release_id'])" "$rel_n")
"$PY" -m tileship.cli activate "$old_id" --registry "$reg" --force
"$PY" -m tileship.cli activate "$new_id" --registry "$reg" --force
"$PY" -m tileship.cli releases --registry "$reg" > "$out/releases.txt" 2>&1

server_args=(--server-arg=--diagnostics-dir --server-arg="$out/drill/diagnostics")
[ "${ALLOW_UNVERIFIED:-1}" = 1 ] && server_args+=(--server-arg=--allow-unverified)
for a in ${SERVER_ARG:-}; do server_args+=(--server-arg="$a"); done  # e.g. "--no-warm-rollback --warmup-threads=1"
"$PY" -m tileship.cli drill --registry "$reg" --new "$new_id" --old "$old_id" --out "$out/drill" \
  --phase-seconds "${PHASE_SECONDS:-10}" --concurrency "${CONCURRENCY:-8}" "${server_args[@]}" > "$out/drill.stdout" 2>&1
echo "drill rc=$?"
cat "$out/drill/drill.txt" 2>/dev/null || tail -40 "$out/drill.stdout"

if [ "${FAULT:-1}" = 1 ]; then
  "$PY" benchmarks/gpu_fault_recovery.py --out "$out/fault" --restarts "${RESTARTS:-3}" > "$out/fault.stdout" 2>&1
  echo "fault recovery rc=$?"
  tail -25 "$out/fault.stdout"
fi
