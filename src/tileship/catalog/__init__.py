"""Built-in operators with PyTorch references: the demo's embedded default.

- ``gemm``: fp16/bf16 GEMM, one ``T.dynamic`` M kernel per (N, K) plus static large shapes (CUDA).
- ``rmsnorm``: one row per block RMSNorm with weight, dynamic M (CUDA).
- ``attention``: causal flash-attention forward, (B, H, S, D) (CUDA).
- ``w4a16``: weight-only int4 linear (int4 packed 8 per int32, group-128 scales) for the Llama-3-8B
  projections: a GEMV for decode batches, tensor cores for larger and dynamic M (CUDA).
- ``gqa_decode``: GQA decode attention over a KV cache with per-sequence lengths, split-KV (CUDA).
- ``gqa_paged``: the same over a paged KV cache (pages of 64 and a block table) (CUDA).
- ``add_rmsnorm``: residual add + RMSNorm in one pass, returning the norm and the new residual (CUDA).
- ``kv_append``: the KV-cache append that goes with ``gqa_decode``: new K/V rows written in place at
  per-sequence positions (``mutates``, no outputs) (CUDA); ``kv_append_paged``: the same into
  ``gqa_paged``'s pages of 64 (CUDA); ``cpu_cache`` holds their ``"c"`` twins.
- ``cpu``, ``cpu_decode``: kernels written for TileLang's ``"c"`` target so CPU-only CI runs real
  TileLang code, among them twins of the decode operators with the same contract and reference.

The demo builds ``gemm``, ``rmsnorm``, ``attention`` and ``cpu``; ``benchmarks/decode/tileship.toml``
is the project that builds the decode operators (``benchmarks/gpu_decode.sh``).
"""
