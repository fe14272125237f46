"""Reference models in plain PyTorch, for end-to-end tests and benchmarks of released kernels."""

from tileship.models.llama import CausalSelfAttention, Llama, LlamaConfig, RMSNorm, random_llama

__all__ = ["CausalSelfAttention", "Llama", "LlamaConfig", "RMSNorm", "random_llama"]
