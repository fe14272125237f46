#!/usr/bin/env bash
# GPU host, repo root, PYTHONPATH=/tmp/site:$PWD/src exported:  bash benchmarks/dev/gpu_ray.sh OUT_DIR STAGE
# Issue 19's last target: the Ray build farm (`tileship build --ray-address`) on the host's 16 cores.
# The host has no Ray: it comes as .gpu/ray_a.tar.xz + .gpu/ray_b.tar.xz (one tar.xz split in two,
# benchmarks/dev/ray_host_bundle.sh), carried by one call or by two back-to-back calls (/tmp is kept):
#   STAGE=a: /tmp/ray.part = .gpu/ray_a.tar.xz, then exit (seconds)
#   STAGE=b: /tmp/ray.part (or .gpu/ray_a.tar.xz when this call has it) + .gpu/ray_b.tar.xz, unpacked into
#            /tmp/raysite, then the measurement (about 300 s, cut at DEADLINE=390 s):
#     1. a Ray head on this machine: `ray start --head --num-cpus=16` (token auth with a fresh token)
#     2. `tileship build -j 16` of benchmarks/dev/ray_farm/tileship.toml (118 sm_90a specializations, 40 of
#        them GEMM candidates), then `tileship build --ray-address 127.0.0.1:PORT` of the same project, each
#        into an output folder seeded with the previous H200 build's log (longest first; HISTORY=0: not)
#     3. a serial sample (about 9 specializations, compile_one one at a time) for the parallel efficiency
#     4. benchmarks/dev/ray_farm_h200.py summary: wall, per minute, built/failed, per node, same release
#        (id and every identity file), efficiency = serial seconds / (16 x build seconds)
# Only OUT_DIR/all_ray.tgz comes back (the device tool returns at most 8 files).
# CPU rehearsal: RAY_BUNDLE_DIR=/tmp/raybundle311 RAY_PROJECT=benchmarks/tuned/cpu/tileship.toml JOBS=2 ...
set -u
out=${1:?usage: gpu_ray.sh OUT_DIR a|b}
stage=${2:?usage: gpu_ray.sh OUT_DIR a|b}
bundle=${RAY_BUNDLE_DIR:-.gpu}
project=${RAY_PROJECT:-benchmarks/dev/ray_farm/tileship.toml}
jobs=${JOBS:-16}
port=${RAY_PORT:-6391}
deadline=${DEADLINE:-390}  # seconds from the start of this script; the call itself is cut at 600
mkdir -p "$out"
if [ "$stage" = a ]; then
  cat "$bundle/ray_a.tar.xz" > /tmp/ray.part || exit 3
  echo "stage a: /tmp/ray.part $(stat -c %s /tmp/ray.part) bytes; now STAGE=b within 30 s"
  exit 0
fi
[ "$stage" = b ] || { echo "STAGE is a or b" >&2; exit 2; }
d=/tmp/ray_run; rm -rf "$d" /tmp/rayt /tmp/rf-local /tmp/rf-ray; mkdir -p "$d"
raypid=
finish() {
  if [ -n "$raypid" ]; then  # the head and everything it started share its process group
    kill -TERM -- "-$raypid" 2>/dev/null; sleep 3; kill -KILL -- "-$raypid" 2>/dev/null
  fi
  for f in "$RAY_TMP"/session_latest/logs/{raylet.out,raylet.err,gcs_server.err,python-core-driver-*.log}; do
    [ -f "$f" ] && tail -c 200000 "$f" > "$d/raylogs_$(basename "$f")"
  done 2>/dev/null
  tar -C "$d" -czf "$out/all_ray.tgz" .
}
RAY_TMP=/tmp/rayt  # short: Ray's socket paths live under it
trap finish EXIT
step() {  # step NAME TIMEOUT_S CMD...: run under a timeout capped by the deadline, record wall and rc
  local name=$1 cap=$2; shift 2
  local left=$(( deadline - SECONDS )); [ "$cap" -lt "$left" ] || cap=$left
  if [ "$cap" -le 5 ]; then echo "$name: skipped, $left s left before the deadline" | tee -a "$d/steps.txt"; return 124; fi
  local t0 t1 rc; t0=$(date +%s.%N)
  timeout -k 5 "$cap" "$@"; rc=$?
  t1=$(date +%s.%N); echo "$name $t0 $t1 $rc" >> "$d/times.txt"
  echo "$name: rc=$rc in $(python3 -c "print(round($t1 - $t0, 1))") s (limit $cap s)" | tee -a "$d/steps.txt"
  return $rc
}
# 0. the bundle
if [ -s "$bundle/ray_a.tar.xz" ]; then cat "$bundle/ray_a.tar.xz" > /tmp/ray.part
elif [ ! -s /tmp/ray.part ]; then echo "no part a: run STAGE=a first, or carry $bundle/ray_a.tar.xz in this call too"; exit 3; fi
[ -f "$bundle/ray_b.tar.xz" ] && cat "$bundle/ray_b.tar.xz" >> /tmp/ray.part
echo "bundle: $(stat -c %s /tmp/ray.part) bytes, sha256 $(sha256sum < /tmp/ray.part | cut -c1-16)" | tee "$d/bundle.txt"
rm -rf /tmp/raysite; mkdir -p /tmp/raysite
step unpack 60 tar -C /tmp/raysite -xJf /tmp/ray.part || { echo "the bundle does not unpack: parts missing or out of order"; exit 3; }
export PYTHONPATH=${PYTHONPATH:-$PWD/src}:/tmp/raysite
# shellcheck source=benchmarks/gpu_env.sh
. benchmarks/gpu_env.sh "$d/nvidia-smi.csv"
{ nproc; free -g | head -2; df -h /dev/shm /tmp | tail -2; python3 --version; echo "PYTHONPATH=$PYTHONPATH"; } > "$d/host.txt" 2>&1
step warm 60 python3 -c "
import importlib, ray, torch, tilelang, tileship
print('ray', ray.__version__, ray.__file__, 'tilelang', tilelang.__version__)
for m in ('click', 'typer', 'attr', 'packaging', 'jsonschema', 'referencing', 'rpds', 'msgpack', 'google.protobuf', 'yaml', 'requests', 'filelock'):
    try:
        mod = importlib.import_module(m)
        print(f'  {m} {getattr(mod, \"__version__\", \"?\")} {mod.__file__}')
    except Exception as exc:
        print(f'  {m} MISSING ({exc})')
" > "$d/warm.log" 2>&1 || { echo "ray, torch, tilelang or tileship does not import (is /tmp/site there?):"; tail -5 "$d/warm.log"; exit 5; }
grep -m1 "^ray " "$d/warm.log"
# 1. the head: token auth with a token of this run (Ray 2.60 enables it for `ray start` when ~/.ray/auth_token
#    exists, and a driver naming an explicit address only sends a token with RAY_AUTH_MODE=token)
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN; RAY_AUTH_TOKEN=$(python3 -c "import secrets; print(secrets.token_hex(32))")
t0=$(date +%s.%N)
setsid python3 -m ray.scripts.scripts start --head --block --port="$port" \
  --num-cpus="$jobs" --num-gpus=0 --include-dashboard=false --disable-usage-stats --temp-dir="$RAY_TMP" \
  --object-store-memory=2000000000 > "$d/ray_start.log" 2>&1 &
raypid=$!
for _ in $(seq 120); do grep -q "Ray runtime started" "$d/ray_start.log" && break; kill -0 "$raypid" 2>/dev/null || break; sleep 0.5; done
echo "ray_start $t0 $(date +%s.%N) $(grep -q 'Ray runtime started' "$d/ray_start.log"; echo $?)" >> "$d/times.txt"
if ! grep -q "Ray runtime started" "$d/ray_start.log"; then echo "the Ray head did not start:"; tail -20 "$d/ray_start.log"; exit 4; fi
echo "ray head up (pgid $raypid) after $(tail -1 "$d/times.txt" | awk '{printf "%.1f", $3 - $2}') s"
# 2. the same project built locally, then on the farm. Each output folder starts with the build log of the
#    previous H200 build (benchmarks/dev/ray_farm/h200_build_log.json, from round6/ray/local.log) in a
#    folder of its own, so both builds start their compiles longest first (build/schedule.py), as a rebuild
#    into a used output folder does; HISTORY=0 starts them in declaration order (the first-build case)
if [ "${HISTORY:-1}" != 0 ]; then
  for root in /tmp/rf-local /tmp/rf-ray; do
    mkdir -p "$root/previous-h200-build" && cp benchmarks/dev/ray_farm/h200_build_log.json "$root/previous-h200-build/build-log.json"
  done
  echo "history: seeded from benchmarks/dev/ray_farm/h200_build_log.json" | tee -a "$d/steps.txt"
fi
step local 150 python3 -m tileship.cli build --project "$project" --out /tmp/rf-local -j "$jobs" > "$d/local.log" 2>&1
tail -1 "$d/local.log"
step ray 150 python3 -m tileship.cli build --project "$project" --out /tmp/rf-ray -j "$jobs" \
  --ray-address "127.0.0.1:$port" > "$d/ray.log" 2>&1
grep "^\[ray\] per node" "$d/ray.log"; tail -1 "$d/ray.log"
kill -TERM -- "-$raypid" 2>/dev/null; sleep 3; kill -KILL -- "-$raypid" 2>/dev/null; raypid=
# 3. the serial sample with what is left (the head is down: nothing else runs)
budget=$(( deadline - SECONDS - 20 ))
step serial $(( budget + 10 )) python3 benchmarks/dev/ray_farm_h200.py serial "$project" "$d/serial.json" \
  --k "${SERIAL_K:-9}" --budget-s "$budget" > "$d/serial.log" 2>&1
tail -3 "$d/serial.log"
# 4. the summary
timeout 30 python3 benchmarks/dev/ray_farm_h200.py summary "$d" --cores "$jobs" 2>&1 | tee "$d/summary.txt"
echo "total $SECONDS s"
