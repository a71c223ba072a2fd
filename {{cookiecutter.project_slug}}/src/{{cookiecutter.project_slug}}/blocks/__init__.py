"""Network building blocks that tasks may use.

A causal transformer and LoRA adapters (`transformer`). Your own architectures go in
`models.py` at the package's top.

May import: `errors` only (a block knows nothing of training).
"""
