"""Initial weights (`model.init_from`) from the files a model is shipped in.

Three layouts are read, all onto the CPU without reading more than the tensors themselves:

- a safetensors file (`*.safetensors`): plain tensors, no pickled code, memory-mapped;
- a folder as a model hub download leaves it (fetched once on a login node, copied to the
  cluster): `model.safetensors.index.json` naming the shard file of every tensor, or a single
  `model.safetensors`;
- a PyTorch file (`torch.save` of a state dict, or a checkpoint of another run of this
  project), loaded with `mmap=True`: pages are read as the tensors are copied into the model,
  so a large file never sits in host memory twice.

Every failure is one line that names the path: a missing file or shard, an index that is not
JSON, a file that is none of these formats.
"""

import json
from pathlib import Path

import torch

from ..errors import ConfigError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FIELD = "model.init_from"


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    # Imported here: only runs that read safetensors pay for the import.
    from safetensors import SafetensorError  # noqa: PLC0415
    from safetensors.torch import load_file  # noqa: PLC0415

    try:
        weights: dict[str, torch.Tensor] = load_file(path, device="cpu")
    except (SafetensorError, OSError) as err:
        raise ConfigError(f"{FIELD}: {path} is not a safetensors file: {err}") from None
    return weights


def _sharded(folder: Path) -> dict[str, torch.Tensor]:
    index = folder / INDEX
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{FIELD}: {index} has no valid weight_map: {err}") from None
    if not isinstance(weight_map, dict):
        raise ConfigError(f"{FIELD}: {index}: weight_map must map tensor names to files")
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        path = folder / shard
        if not path.is_file():
            raise ConfigError(f"{FIELD}: shard {shard} named in {index} is missing")
        tensors = _safetensors(path)
        wanted = {k for k, v in weight_map.items() if v == shard}
        if absent := sorted(wanted - tensors.keys()):
            raise ConfigError(f"{FIELD}: {path} lacks {absent[0]}, which {INDEX} puts there")
        weights.update((k, tensors[k]) for k in wanted)
    return weights


def _pickled(path: Path) -> dict[str, torch.Tensor]:
    try:
        weights = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # any unreadable file: one line, not a traceback
        raise ConfigError(
            f"{FIELD}: {path} is not a safetensors or PyTorch weights file: {err}"
        ) from None
    if isinstance(weights, dict) and isinstance(weights.get("model"), dict):
        weights = weights["model"]  # a checkpoint of another run
    if not isinstance(weights, dict):
        raise ConfigError(f"{FIELD}: {path} holds a {type(weights).__name__}, not a state dict")
    return weights


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The state dict stored at `path` (a file or a model folder), on the CPU."""
    if path.is_dir():
        if (path / INDEX).is_file():
            return _sharded(path)
        if (path / SINGLE).is_file():
            return _safetensors(path / SINGLE)
        raise ConfigError(f"{FIELD}: folder {path} has neither {INDEX} nor {SINGLE}")
    if not path.is_file():
        raise ConfigError(f"{FIELD}: no file {path}")
    return _safetensors(path) if path.suffix == ".safetensors" else _pickled(path)
