#!/usr/bin/env bash
# worker hop A/B on this CPU machine: round 32's tree (4ea3e53) vs main HEAD, alternated twice, each its own CPU release
set -u
for i in 1 2; do
  for t in r32 head; do
    if [ $t = r32 ]; then root=/work/ab/r32; else root=/work/main; fi
    (cd $root && PYTHONPATH=$root/src timeout 400 /work/main/.venv/bin/python benchmarks/serve_workers.py --rounds 6 \
      --per-round 300 --kills 0 --out /work/ab/hop_${t}_$i.json > /work/ab/hop_${t}_$i.log 2>&1)
    python3 -c "
import json;d=json.load(open('/work/ab/hop_${t}_$i.json'));l=d['latency_us'];print('$t $i', 'w0', l['workers0']['p50_us'], 'w1', l['workers1']['p50_us'], 'hop', l['hop_p50_us'], l['hop_spread_us'], 'nospin', l.get('nospin_hop_p50_us'))"
  done
done
