"""Models: a multi-layer perceptron and a small convolutional network.

A library for tasks: a task's `build_model` calls `build_model(cfg.model, shape, outputs)` or
builds its own network. Add an architecture here as a function and a name in `ARCHITECTURES`.
"""

import math

import torch
from torch import nn

from .config import ModelConfig
from .errors import ConfigError


def mlp(input_shape: tuple[int, ...], outputs: int, cfg: ModelConfig) -> nn.Module:
    """Flatten, then `depth` hidden layers of width `hidden` with GELU and dropout."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for _ in range(cfg.depth):
        layers += [nn.Linear(width, cfg.hidden), nn.GELU(), nn.Dropout(cfg.dropout)]
        width = cfg.hidden
    layers.append(nn.Linear(width, outputs))
    return nn.Sequential(*layers)


class GlobalAvgPool(nn.Module):
    """The mean over height and width, keeping them as 1 x 1 (as `AdaptiveAvgPool2d(1)` does).

    Written as a mean because its backward is deterministic on CUDA; AdaptiveAvgPool2d's
    backward kernel is not, so `run.deterministic` runs would not repeat bit for bit.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, C, 1, 1)."""
        return x.mean(dim=(2, 3), keepdim=True)


def cnn(input_shape: tuple[int, ...], outputs: int, cfg: ModelConfig) -> nn.Module:
    """Two conv-BN-ReLU blocks with pooling, global average pooling and a linear head."""
    channels, width = input_shape[0], cfg.channels

    def block(c_in: int, c_out: int) -> list[nn.Module]:
        return [
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
        ]

    return nn.Sequential(
        *block(channels, width),
        nn.MaxPool2d(2),
        *block(width, 2 * width),
        GlobalAvgPool(),
        nn.Flatten(),
        nn.Dropout(cfg.dropout),
        nn.Linear(2 * width, outputs),
    )


ARCHITECTURES = {"mlp": mlp, "cnn": cnn}


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], outputs: int) -> nn.Module:
    """The model named by `model.name` for inputs of `input_shape` and `outputs` outputs."""
    if cfg.name not in ARCHITECTURES:
        raise ConfigError(f"model.name: must be one of {sorted(ARCHITECTURES)}, got {cfg.name!r}")
    if cfg.name == "cnn" and len(input_shape) != 3:
        raise ConfigError(f"model.name = 'cnn' needs C x H x W inputs, got shape {input_shape}")
    return ARCHITECTURES[cfg.name](input_shape, outputs, cfg)
