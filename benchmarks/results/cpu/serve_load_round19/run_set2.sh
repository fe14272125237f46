#!/bin/bash
# alternating A (91923cb) / B (b77fad5) serve_load runs, 3 reps x 4 configs
REL=/tmp/serve-load-rel-eeo0cr4i/f0da87eebd35815b
PY=/work/main/.venv/bin/python
cd /tmp/mine_r19/set2
for rep in 0 1 2; do
  for cfg in "add N=4096 bin" "rmsnorm_cpu M=1,N=1024 bin" "add N=4096 json" "rmsnorm_cpu M=1,N=1024 json"; do
    set -- $cfg
    op=$1; dims=$2; fmt=$3
    J=""; [ $fmt = json ] && J="--json"
    for t in B A; do
      if [ $rep = 1 ]; then order=$t; fi
      out=${t}_${op}_${fmt}_${rep}
      echo "$(date -u +%H:%M:%S) $out" >> progress.txt
      $PY /tmp/ab/$([ $t = A ] && echo A || echo B2)/benchmarks/serve_load.py --release $REL --op $op --dims $dims $J \
         --clients 8 --duration 2 --seq 600 --out $out.json > $out.txt 2>&1
    done
  done
done
echo done >> progress.txt
