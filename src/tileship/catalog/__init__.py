"""Built-in operators with PyTorch references: the demo's embedded default.

- ``gemm``: fp16/bf16 GEMM, one ``T.dynamic`` M kernel per (N, K) plus static large shapes (CUDA).
- ``rmsnorm``: one row per block RMSNorm with weight, dynamic M (CUDA).
- ``attention``: causal flash-attention forward, (B, H, S, D) (CUDA).
- ``cpu``: kernels written for TileLang's ``"c"`` target so CPU-only CI runs real TileLang code.
"""
