#!/usr/bin/env bash
set -u
REL=${REL:?}
for i in 1 2 3; do
  for t in base new; do
    if [ $t = base ]; then root=/work/ab/base_tree; else root=/work/main; fi
    (cd $root && PYTHONPATH=$root/src timeout 120 /work/main/.venv/bin/python benchmarks/serve_grpc_load.py --release $REL --op add \
      --dims N=4096 --clients 4 --duration 2 --seq 1000 --out /work/ab/grpc_${t}_$i.json > /work/ab/grpc_${t}_$i.log 2>&1)
    python3 -c "
import json;d=json.load(open('/work/ab/grpc_${t}_$i.json'));print('$t $i', 'seq p50', d['grpc_sequential']['p50_us'], 'full', d['in_process']['full']['p50_us'], 'echo', d['grpc_echo_floor']['p50_us'], 'over full', d['overhead_p50_us']['vs_in_process_full'], 'load', d['environment'].get('load_average_1m'))"
  done
done
