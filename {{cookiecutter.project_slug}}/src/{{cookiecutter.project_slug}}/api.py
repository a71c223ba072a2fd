"""Everything a task imports, in one place: `from ..api import Task, Datasets, ...`.

Tasks (`tasks/<name>.py`) import only from here, so the package's wings can move without an
edit to your research code. What each name is:

- the seam: `Task` (subclass it), `Batch`, `Datasets`, `NoOptions`, `Where` (the type of
  `Task.where`), and `Config` and `Settings` (what a task's `__init__` gets); the ready-made
  kinds `Classification` and `Regression`, and `need_torchmetrics` (a setting that needs the
  `metrics` extra);
- averaged weights: `EMA` (set as `self.averaged`, updated in `after_step`);
- helpers for a task's data: `split_indices`, `class_labels`, `sample_generator` (the random
  numbers of the batch being loaded), `ShardReader` and `write_shards` (many small files in
  a few shards), `write_made_with` and `check_made_with` (the settings and files that shaped
  processed data, checked when it is used; `files_digest` of a tokenizer's files), `raw_text`
  and `read_utf8` (a text file below data/raw, and its text or the byte that is not UTF-8);
- streams (a train split without length or random access): `stream_part` (which share of
  the processes and workers this copy reads), `ShuffleBuffer` (a seeded shuffle whose
  contents resume exactly), `TarShards` (WebDataset-style tar files), `hf_stream` (a Hugging
  Face `datasets` stream over local files: the `datasets` extra) and `write_parquet` (parquet
  files whose pages carry checksums, which `hf_stream` verifies as it reads);
- models: `build_model` (`models.py`, yours), `CausalLM` and `LoRA` (`blocks/transformer.py`);
- processes that talk: `gather_with_grad` (every process's rows of a tensor, with gradients:
  in-batch negatives over the global batch);
- pretrained weights: `read_weights` (a safetensors file, a hub folder or a PyTorch file; a
  path it cannot read is one line naming the `[task]` option that held it) and `INDEX`, the
  file name of a sharded hub folder's index;
- errors that stop a command with one line: `ConfigError` (a bad setting), `DataError` (bad
  or missing data).
"""

from .blocks.transformer import CausalLM, LoRA
from .config import Config
from .data.hf_streams import hf_stream, write_parquet
from .data.made_with import check_made_with, files_digest, write_made_with
from .data.pretrained import INDEX, read_weights
from .data.shards import ShardReader, write_shards
from .data.streams import ShuffleBuffer, StreamPart, stream_part
from .data.tars import TarShards, write_tar_shards
from .data.text import raw_text, read_utf8
from .engine.loop.averaging import EMA
from .engine.parallel.distributed import gather_with_grad
from .errors import ConfigError, DataError
from .models import build_model
from .settings import Settings
from .task import (
    Batch,
    Datasets,
    NoOptions,
    Task,
    Where,
    class_labels,
    sample_generator,
    split_indices,
)
from .task_kinds import Classification, Regression, need_torchmetrics

__all__ = [
    "EMA",
    "INDEX",
    "Batch",
    "CausalLM",
    "Classification",
    "Config",
    "ConfigError",
    "DataError",
    "Datasets",
    "LoRA",
    "NoOptions",
    "Regression",
    "Settings",
    "ShardReader",
    "ShuffleBuffer",
    "StreamPart",
    "TarShards",
    "Task",
    "Where",
    "build_model",
    "check_made_with",
    "class_labels",
    "files_digest",
    "gather_with_grad",
    "hf_stream",
    "need_torchmetrics",
    "raw_text",
    "read_utf8",
    "read_weights",
    "sample_generator",
    "split_indices",
    "stream_part",
    "write_made_with",
    "write_parquet",
    "write_shards",
    "write_tar_shards",
]
