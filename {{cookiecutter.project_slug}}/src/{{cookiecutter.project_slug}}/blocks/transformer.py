"""A decoder-only transformer for next-token prediction, and LoRA adapters for any model.

`CausalLM` (token ids in, next-token logits out) serves the language-model example
(tasks/lm.py); `LoRA` freezes any model and trains low-rank updates of its linear layers.
Plain PyTorch rather than `transformers`: a few dozen lines, nothing to download, no heavy
dependency, and parameter names that stay stable in checkpoints and safetensors files.
"""

import math
from collections.abc import Callable

import torch
from torch import nn

from ..errors import ConfigError


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then a GELU MLP, both residual."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        """`width` must be a multiple of `heads`."""
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """B x T x width -> B x T x width."""
        b, t, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, -1).transpose(1, 3).unbind(2)
        attn = nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, width))
        return x + self.mlp(self.norm2(x))


class CausalLM(nn.Module):
    """Token and position embeddings, `depth` blocks, a final norm and a linear head.

    The blocks are an `nn.ModuleList` (`self.blocks`): per-block sharding (FSDP) and
    activation checkpointing find them there. The head is not tied to the embedding, so no
    two parameters share memory (sharding and safetensors files prefer that).
    """

    def __init__(
        self, vocab: int, context: int, *, width: int, depth: int, heads: int, dropout: float
    ) -> None:
        """A model for sequences of up to `context` tokens from a vocabulary of `vocab`."""
        super().__init__()
        if width % heads:
            raise ConfigError(f"model.hidden: {width} is not a multiple of task.heads = {heads}")
        self.context = context
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """B x T token ids (T <= context) -> B x T x vocab logits of the next token."""
        x = self.embed(ids) + self.position(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class LowRank(nn.Module):
    """The update `scale * B A x` of one linear layer; B starts at zero (no change at first)."""

    def __init__(self, inputs: int, outputs: int, rank: int, alpha: float) -> None:
        """A (rank x inputs) random, B (outputs x rank) zero, scale alpha / rank."""
        super().__init__()
        self.a = nn.Parameter(torch.empty(rank, inputs))
        self.b = nn.Parameter(torch.empty(outputs, rank))
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """A normal with variance 1 / inputs, B zero: the update starts at exactly zero."""
        with torch.no_grad():
            self.a.normal_(0.0, 1.0 / math.sqrt(self.a.shape[1]))
            self.b.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The low-rank term added to the layer's output."""
        return (x @ self.a.t() @ self.b.t()) * self.scale


class LoRA(nn.Module):
    """A frozen `base` whose linear layers named in `targets` get trainable low-rank updates.

    A few lines instead of the `peft` package: no optional heavy dependency, and the base keeps
    its parameter names (`base.*`), so pretrained weights load into `self.base` unchanged while
    the adapters live beside it (`adapters.*`). Forward hooks add each update to its layer's
    output.
    """

    def __init__(self, base: nn.Module, rank: int, alpha: float, targets: tuple[str, ...]) -> None:
        """Freeze `base`; add an adapter to every `nn.Linear` whose name ends in a target."""
        super().__init__()
        self.base = base.requires_grad_(False)
        self.adapters = nn.ModuleDict()
        self.layers: dict[str, str] = {}  # adapter key -> the base layer it adapts (export)
        for name, layer in base.named_modules():
            if isinstance(layer, nn.Linear) and name.split(".")[-1] in targets:
                adapter = LowRank(layer.in_features, layer.out_features, rank, alpha)
                self.adapters[name.replace(".", "_")] = adapter
                self.layers[name.replace(".", "_")] = name
                layer.register_forward_hook(_adds(adapter))
        if not self.adapters:
            raise ConfigError(f"task.lora_rank: no linear layer named one of {list(targets)}")

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        """The base model's output, with the adapters' updates inside."""
        out: torch.Tensor = self.base(*args)
        return out


Hook = Callable[[nn.Module, tuple[torch.Tensor, ...], torch.Tensor], torch.Tensor]


def _adds(adapter: LowRank) -> Hook:
    """A forward hook that adds `adapter`'s update of the layer's input to its output."""

    def hook(
        _layer: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor
    ) -> torch.Tensor:
        return out + adapter(inputs[0]).to(out.dtype)

    return hook
