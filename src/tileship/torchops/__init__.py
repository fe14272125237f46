"""PyTorch integration: a loaded release's operators as ``torch.library`` custom ops, and its
kernels swapped into an existing ``nn.Module``. (Named ``torchops`` so it never shadows ``torch``.)

    custom_ops  ``torch.library`` custom ops for eager, ``torch.compile`` and CUDA graphs
    swap        put a release's kernels into a model in place, and make the model know it
    layers      the plain-PyTorch RMSNorm and causal attention modules that ``swap`` recognises
"""
