"""A Llama-style decoder in plain PyTorch with seeded random weights (``model``), and what
``tileship serve RELEASE --llama CONFIG`` needs to serve it next to the operators (``serve``).

    from examples.llama import LlamaConfig, random_llama
    model = random_llama(LlamaConfig(n_layers=2), seed=0)
"""

from examples.llama.model import CausalSelfAttention, Llama, LlamaConfig, RMSNorm, random_llama

__all__ = ["CausalSelfAttention", "Llama", "LlamaConfig", "RMSNorm", "random_llama"]
