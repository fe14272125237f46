#!/usr/bin/env bash
# GPU host, repo root: bash benchmarks/serve_llama_gpu.sh RELEASE_DIR OUT_DIR
# `tileship serve RELEASE --llama 7b-2layer` on the H200: the CUDA catalog release (gemm, rmsnorm,
# attention; sm_90a, built on a CPU machine) serving the random-weight Llama decoder (hidden 4096,
# 32 heads, intermediate 11008, vocab 32000, 2 layers, float16, seed 0) as model `llama`.
# A few requests with httpx (binary logits): latency per shape (median of 5 after one warm request)
# and max |logits diff| / relative L2 vs the same model run locally in eager PyTorch on the GPU.
# nvcc is hidden from the server's PATH: nothing may compile. Writes OUT_DIR/serve_llama.json,
# OUT_DIR/serve_llama.txt (this output) and OUT_DIR/serve_llama_server.log. Exit 0 when every
# shape answered and stayed within tolerance (rel L2 <= 1e-2 for float16), else 1.
set -u
rel=$1; out=$2
mkdir -p /tmp/site "$out" && tar -C /tmp/site -xJf .gpu/site.tar.xz
export PYTHONPATH=/tmp/site:$PWD/src:$PWD TILELANG_CACHE_DIR=/tmp/tlcache  # $PWD: examples/llama
PY=$(command -v python3)
port=8731
PATH=/usr/bin:/bin "$PY" -m tileship.cli serve "$rel" --port "$port" --llama 7b-2layer --allow-unverified \
    --diagnostics-dir "$out/diag" --timeout 300 > "$out/serve_llama_server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
"$PY" - "$port" "$out/serve_llama.json" "$server" <<'EOF' 2>&1 | tee "$out/serve_llama.txt"
import json
import os
import statistics
import sys
import time

import httpx
import numpy as np
import torch

from examples.llama import random_llama
from examples.llama.serve import parse_spec

port, out, server_pid = int(sys.argv[1]), sys.argv[2], sys.argv[3]
url = f"http://127.0.0.1:{port}"
t0 = time.perf_counter()
while True:  # weights are built, then swapped onto the release, before it is ready
    try:
        r = httpx.get(url + "/v2/health/ready", timeout=5)
        if r.status_code == 200:
            break
        body = r.json()
        if body.get("state") in ("failed", "fatal"):
            sys.exit(f"server not ready: {body}")
    except httpx.TransportError:
        if not os.path.exists(f"/proc/{server_pid}"):
            sys.exit("the server exited before it was ready: see serve_llama_server.log")
    if time.perf_counter() - t0 > 900:
        sys.exit("server not ready after 900 s")
    time.sleep(1)
ready_s = time.perf_counter() - t0
meta = httpx.get(url + "/v2/models/llama", timeout=30).json()
print(f"ready after {ready_s:.1f} s; {meta['parameters']['swap']}; device {meta['parameters']['device']}")
spec = parse_spec("7b-2layer")
cfg = json.loads(meta["parameters"]["config"])
assert cfg["seed"] == spec.seed and cfg["dtype"] == spec.dtype, cfg
local = random_llama(spec.config(), dtype=getattr(torch, spec.dtype), device="cuda", seed=spec.seed)


http = httpx.Client(timeout=600)  # one keep-alive connection: latency without connection setup


def infer(ids):
    head = json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": list(ids.shape),
                                   "parameters": {"binary_data_size": ids.nbytes}}],
                       "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}).encode()
    t = time.perf_counter()
    r = http.post(url + "/v2/models/llama/infer", content=head + ids.tobytes(),
                   headers={"inference-header-content-length": str(len(head)), "content-type": "application/octet-stream"})
    ms = (time.perf_counter() - t) * 1e3
    if r.status_code != 200:
        raise RuntimeError(f"{r.status_code}: {r.text[:500]}")
    hl = int(r.headers["inference-header-content-length"])
    h = json.loads(r.content[:hl])
    o = h["outputs"][0]
    dt = {"FP16": np.float16, "FP32": np.float32}[o["datatype"]]
    return np.frombuffer(r.content[hl:], dtype=dt).reshape(o["shape"]), h["parameters"], ms


rows, ok = [], True
# (1,2048): the attention's declared prefill; (1,16), (1,128): undeclared S (attention on SDPA);
# (8,1): a no-KV-cache decode step (M=8 GEMMs)
for b, s in [(1, 16), (1, 128), (8, 1), (1, 2048)]:
    ids = np.random.default_rng(b * 10000 + s).integers(0, spec.vocab, size=(b, s), dtype=np.int64)
    try:
        logits, params, _ = infer(ids)  # warm: first call of this shape
        times = [infer(ids)[2] for _ in range(5)]
    except Exception as exc:
        print(f"({b},{s}) FAILED: {exc}")
        rows.append({"shape": [b, s], "error": str(exc)})
        ok = False
        continue
    with torch.inference_mode():
        want = local(torch.from_numpy(ids).cuda()).float().cpu().numpy()
    got = logits.astype(np.float32)
    diff = np.abs(got - want)
    rel_l2 = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
    row = {"shape": [b, s], "median_ms": statistics.median(times), "min_ms": min(times), "max_abs_diff": float(diff.max()),
           "rel_l2": rel_l2, "path": params["tileship_path"], "kernel_calls": params["tileship_kernel_calls"],
           "reference_calls": params["tileship_reference_calls"], "pytorch_layers": params["tileship_pytorch_layers"],
           "dispatch": json.loads(params["tileship_dispatch"]), "release": params["tileship_release"],
           "response_mib": round(logits.nbytes / 2**20, 1)}
    ok &= rel_l2 <= 1e-2
    rows.append(row)
    print(f"({b:2d},{s:5d}) {row['median_ms']:9.2f} ms median (HTTP incl. {row['response_mib']} MiB logits)  "
          f"max|diff| {row['max_abs_diff']:.3g}  rel L2 {rel_l2:.2e}  {row['path']}: {row['kernel_calls']} kernel, "
          f"{row['reference_calls']} reference, {row['pytorch_layers']} pytorch layers")
metrics = httpx.get(url + "/metrics", timeout=30).text
compiles = [ln for ln in metrics.splitlines() if ln.startswith("tileship_serve_compile_attempts")]
print("compile attempts:", compiles)
json.dump({"ready_s": ready_s, "metadata": meta, "rows": rows, "compile_attempts": compiles, "ok": bool(ok),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}, open(out, "w"), indent=2, sort_keys=True)
sys.exit(0 if ok else 1)
EOF
rc=${PIPESTATUS[0]}
echo "serve_llama rc=$rc"
exit "$rc"
