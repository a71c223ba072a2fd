"""`export`: a run's weights as a model folder that the hub tools and `model.init_from` load.

The folder holds:
- the weights as safetensors (tensors only: reading them runs no code, unlike a pickle), in
  `fp32` or `bf16`, one `model.safetensors` or shards of at most `shard_gb` with
  `model.safetensors.index.json`, as `save_pretrained` writes them; tied tensors once;
- when the run started from a hub folder (`model.init_from` with a `config.json`): that
  `config.json` (its dtype set to the export's) and the folder's tokenizer and generation files:
  `AutoModelForCausalLM.from_pretrained(out)` and vLLM load it as they load the original;
- `config.toml`, the run's configuration (the task's `build_model` rebuilds the network), and
  `export.json`, the record that makes the folder recognisably this run's export.

`module` exports one part of the model (a distillation's student without its teacher): the
tensors of that submodule, named as inside it, so the folder loads into that module alone
(`module.load_state_dict(read_weights(out))`, or `model.init_from` of a run whose model it
is). A command-line choice rather than a task hook: the whole model stays exportable from the
same run, and a run trained before needs no change of code. The hub files describe the whole
model, so they are left out.

A LoRA run (a `task.LowRankAdapted` model, e.g. `blocks/transformer.LoRA`) is exported
merged: each adapted layer's weight plus `scale * B A`, under the base model's names, so the
folder is an ordinary model. With `adapters=True` the adapters alone are written as a `peft`
adapter folder (`adapter_config.json`, `adapter_model.safetensors`) that
`PeftModel.from_pretrained(base, out)` loads onto the base model.

Streamed: tensors are read from the checkpoint (engine/state/run_weights.ModelTensors; never the
optimizer) and from `model.init_from` (a frozen base) one output shard at a time, so the peak
memory is about one shard. Written into a temporary folder and renamed into place. Every
file and the folder get the modes the umask gives new ones, as a checkpoint's do: under umask
002 or 022 the group reads the export from shared storage.
"""

import errno
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import to_toml
from ..data.pretrained import FIELD, INDEX, SINGLE, WeightFiles
from ..data.processed import swapped_in
from ..engine.state.initial_weights import tie_groups
from ..engine.state.run_weights import ModelTensors, model_on_meta, target_prefix
from ..errors import ConfigError
from ..settings import Settings
from ..task import LowRankAdapted, Task, config_from_dict

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
HUB_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # config.json's names
MODEL_FILE = SINGLE
ADAPTER_FILE, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
# Written into every export folder: the run it came from and the files export wrote there.
# `export` replaces only a folder that holds this record for the same run, and within it only
# the files the record lists: what the user added (notes, an evaluation) stays. Any other
# existing path is refused, never overwritten.
RECORD = "export.json"
# What an export made before the record listed its files may have written (other files stay).
EARLIER = (RECORD, "config.toml", "config.json", INDEX, ADAPTER_CONFIG)


def check_out(out_dir: Path, run_dir: Path) -> None:
    """Refuse an `out_dir` that exists and is not an earlier export of the same run."""
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    try:  # a file, a folder without the record or a damaged record: not an export of ours
        earlier = json.loads((out_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        earlier = None
    if out_dir.is_symlink() or not isinstance(earlier, dict) or earlier.get("run") != run_dir.name:
        raise ConfigError(
            f"--out {out_dir}: exists and is not an earlier export of run {run_dir.name} "
            f"(no {RECORD} naming it); export writes only a new folder or replaces its own"
        )


def added_by_user(out_dir: Path, init: Path | None) -> list[str]:
    """Names in an earlier export folder that export did not write (kept by the next one)."""
    if not out_dir.is_dir():
        return []
    record = json.loads((out_dir / RECORD).read_text(encoding="utf-8"))  # `check_out` read it
    written = record.get("files")
    if not isinstance(written, list):  # an export of an earlier release: its kinds of file
        hub = {p.name for p in init.iterdir()} if init is not None and init.is_dir() else set()
        written = [*EARLIER, *hub]
        written += [p.name for p in out_dir.glob("*.safetensors")]
    return sorted(p.name for p in out_dir.iterdir() if p.name not in written)


def _keep(names: list[str], old: Path, new: Path) -> None:
    """The user's files of `old` into `new`, as hard links (nothing is copied or moved)."""
    for name in names:
        if (new / name).exists():
            raise ConfigError(
                f"export: {old / name} is yours (export did not write it), and this export "
                "writes a file of that name; move it away, or export with --out elsewhere"
            )
        if (old / name).is_dir() and not (old / name).is_symlink():
            shutil.copytree(old / name, new / name, symlinks=True, copy_function=os.link)
        else:
            os.link(old / name, new / name, follow_symlinks=False)


def _no_room(err: Exception) -> bool:
    """Whether a write failed for want of room (a full disk, a quota, a file size limit).

    safetensors reports it as a SafetensorError carrying the system's message, not an OSError.
    """
    codes = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
    if isinstance(err, OSError):
        return err.errno in codes
    return any(os.strerror(code) in str(err) for code in codes)


def _written_fails(err: Exception, out_dir: Path) -> ConfigError:
    """One line for a write that failed (a full disk): the folder and its free space."""
    try:
        free = f"{shutil.disk_usage(out_dir.parent).free / 1e9:.1f} GB free there"
    except OSError:
        free = "free space unknown"
    reason = getattr(err, "strerror", None) or str(err).splitlines()[0]
    return ConfigError(
        f"export: writing into {out_dir.parent} failed ({reason}; {free}); nothing was left "
        "half-written: free space, or export with --out on another disk (--dtype bf16 halves it)"
    )


def _new_file_mode() -> int:
    """The mode `open` gives a new file under this process's umask (0o666 less the umask).

    Every file export writes gets it, as a checkpoint's files (written with `open`) do: a
    group that may read the project's storage (umask 002 or 022) may read the export.
    safetensors writes 0600 (through a temporary file) and `copy2` keeps the source's mode.
    The umask can only be read by setting it: set back at once, before any file is written.
    """
    umask = os.umask(0o077)
    os.umask(umask)
    return 0o666 & ~umask


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous copy; floating tensors in `dtype`, integer buffers (counters) as they are."""
    target = dtype if tensor.is_floating_point() else tensor.dtype
    return tensor.detach().to(dtype=target, copy=True).contiguous()


class Source:
    """Where each tensor of the exported model comes from: the checkpoint or the frozen base."""

    def __init__(self, run_dir: Path, which: str, settings: Settings) -> None:
        """The run's checkpoint, task and model structure; its `model.init_from` if any."""
        self.ckpt = ModelTensors(run_dir, which)
        self.cfg = config_from_dict(self.ckpt.config)
        self.task, self.net = model_on_meta(self.ckpt.config, settings)
        init = Path(self.cfg.model.init_from) if self.cfg.model.init_from else None
        self.init = init if init is None or init.is_absolute() else settings.project_root / init
        self.base = WeightFiles(self.init, FIELD) if self.init and self.ckpt.frozen else None
        prefix = target_prefix(self.task, self.net)
        # A name left out of the checkpoint (frozen) -> its name in init_from's files; a tied
        # tensor stored under another of its names counts as stored.
        self.rename = _frozen_names(self.task, self.net, prefix, self.ckpt.frozen, self.base)

    def hub_config(self) -> dict[str, Any] | None:
        """The `config.json` of the hub folder the run started from, if it did."""
        path = self.init / "config.json" if self.init is not None else None
        if path is None or not path.is_file():
            return None
        config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return config

    def read(self, names: list[str]) -> dict[str, torch.Tensor]:
        """Whole tensors `names` of the model (names as in the run's model)."""
        stored = [n for n in names if n in self.ckpt.shapes]
        tensors = self.ckpt.read(stored) if stored else {}
        frozen = [n for n in names if n not in self.ckpt.shapes]
        if frozen and self.base is not None:
            found = self.base.tensors([self.rename[n] for n in frozen])
            tensors.update((n, found[self.rename[n]]) for n in frozen)
        return tensors


def _frozen_names(
    task: Task, net: nn.Module, prefix: str, frozen: list[str], base: WeightFiles | None
) -> dict[str, str]:
    """Each frozen parameter's name in `model.init_from`'s files."""
    if not frozen:
        return {}
    if base is None:
        raise ConfigError(f"{len(frozen)} frozen parameters are left out and there is no base")
    names, renamed = base.names(), {}
    groups = {n: group for group in tie_groups(net) for n in group}
    for name in frozen:
        candidates = [
            task.pretrained_name(n.removeprefix(prefix)) for n in groups.get(name, [name])
        ]
        present = [c for c in candidates if c in names]
        if not present:
            raise ConfigError(f"model.init_from {base.path}: lacks the frozen parameter {name}")
        renamed[name] = present[0]
    return renamed


def _part(net: nn.Module, module: str) -> str:
    """The prefix of the exported names in the run's model: `module`'s, or LoRA's base's."""
    if not module:
        return "base." if isinstance(net, LowRankAdapted) else ""
    try:
        net.get_submodule(module)
    except AttributeError:
        parts = ", ".join(name for name, _ in net.named_children()) or "none"
        raise ConfigError(
            f"--module {module}: the run's model has no such submodule (its parts: {parts})"
        ) from None
    return f"{module}."


def _layout(net: nn.Module) -> tuple[list[str], dict[str, str]]:
    """The model's tensor names to export (one name per tied tensor), and LoRA's merges.

    Merges: the name of an adapted layer's weight -> the adapter's key in `net.adapters`.
    """
    first = {group[0] for group in tie_groups(net)}
    names = [n for n in net.state_dict(keep_vars=True) if n in first]
    if not isinstance(net, LowRankAdapted):
        return names, {}
    merges = {f"base.{layer}.weight": key for key, layer in net.layers.items()}
    return [n for n in names if not n.startswith("adapters.")], merges


def _shards(sizes: dict[str, int], limit: int) -> list[list[str]]:
    """Names grouped in order into shards of at most `limit` bytes (a larger tensor: alone)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes.items():
        if shards[-1] and used + size > limit:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def _merged(source: Source, names: list[str], merges: dict[str, str]) -> dict[str, torch.Tensor]:
    """Tensors `names`, each adapted layer's weight with its adapter's update added."""
    adapters = [f"adapters.{merges[n]}.{p}" for n in names if n in merges for p in "ab"]
    tensors = source.read([*names, *adapters])
    for name in names:
        if name in merges:
            key = f"adapters.{merges[name]}"
            a, b = tensors.pop(f"{key}.a").float(), tensors.pop(f"{key}.b").float()
            scale = source.net.adapters[merges[name]].scale
            tensors[name] = tensors[name].float() + scale * (b @ a)
    return tensors


def _write_model(
    source: Source, tmp: Path, dtype: str, shard_gb: float, module: str = ""
) -> Iterator[Path]:
    """The (merged) model, or its `module`, as safetensors shards with their index.

    Yields each file written.
    """
    from safetensors.torch import save_file  # noqa: PLC0415  (export only)

    prefix = _part(source.net, module)
    names, merges = _layout(source.net)
    names = [n for n in names if n.startswith(prefix)]
    if module and not names:
        raise ConfigError(f"--module {module}: holds no tensors to export")
    shapes = {**source.ckpt.shapes, **{n: list(p.shape) for n, p in source.net.named_parameters()}}
    width = torch.finfo(DTYPES[dtype]).bits // 8
    sizes = {n: width * int(torch.Size(shapes[n]).numel()) for n in names}
    shards = _shards(sizes, max(1, int(shard_gb * 1e9)))
    weight_map = {}
    for i, part in enumerate(shards):
        file = SINGLE if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = _merged(source, part, merges)
        out = {n.removeprefix(prefix): _cast(tensors[n], DTYPES[dtype]) for n in part}
        save_file(out, tmp / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(out, file))
        yield tmp / file
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
        (tmp / INDEX).write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")
        yield tmp / INDEX


def _write_adapters(source: Source, tmp: Path, dtype: str) -> Iterator[Path]:
    """A `peft` LoRA adapter folder: adapter_config.json and adapter_model.safetensors."""
    from safetensors.torch import save_file  # noqa: PLC0415  (export only)

    net = source.net
    if not isinstance(net, LowRankAdapted):
        raise ConfigError("--adapters: the run trained no LoRA adapters (task.lora_rank = 0)")
    tensors = source.read([f"adapters.{key}.{p}" for key in net.layers for p in "ab"])
    out, ranks = {}, set()
    for key, layer in net.layers.items():
        adapter = net.adapters[key]
        ranks.add((adapter.rank, adapter.alpha))
        for part, peft in (("a", "lora_A"), ("b", "lora_B")):
            out[f"base_model.model.{layer}.{peft}.weight"] = _cast(
                tensors[f"adapters.{key}.{part}"], DTYPES[dtype]
            )
    ((rank, alpha),) = ranks  # one rank and scale for all adapters: LoRA builds them so
    save_file(out, tmp / ADAPTER_FILE, metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM" if source.hub_config() else None,
        "base_model_name_or_path": str(source.init or ""),
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted({layer.rsplit(".", 1)[-1] for layer in net.layers.values()}),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    yield from (tmp / ADAPTER_FILE, tmp / ADAPTER_CONFIG)


def _hub_files(source: Source, tmp: Path, dtype: str) -> Iterator[Path]:
    """config.json (the export's dtype) and the tokenizer files of a hub folder it came from."""
    config = source.hub_config()
    if config is None or source.init is None:
        return
    config["dtype"] = config["torch_dtype"] = HUB_DTYPES[dtype]  # new and older transformers
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    yield tmp / "config.json"
    for file in sorted(source.init.iterdir()):
        weights = file.name.endswith(WEIGHT_SUFFIXES) or file.name == INDEX
        if file.is_file() and file.name != "config.json" and not weights:
            shutil.copy2(file, tmp / file.name)
            yield tmp / file.name


def export_run(
    run_dir: Path,
    out_dir: Path,
    settings: Settings,
    which: str = "final",
    dtype: str = "fp32",
    *,
    adapters: bool = False,
    shard_gb: float = 5.0,
    module: str = "",
) -> Path:
    """Write the model folder (or, with `adapters`, the adapter folder); return `out_dir`.

    `module`: only that submodule of the model (e.g. "student"), its tensors named as in it.

    Written into a temporary folder beside `out_dir` and renamed into place: an interrupted
    export leaves the previous one (or none), never half a folder. `out_dir` must be new or an
    earlier export of this run (`check_out`).
    """
    if shard_gb <= 0:
        raise ConfigError(f"--shard-gb: must be > 0, got {shard_gb}")
    if module and adapters:
        raise ConfigError("--module: a part of the model, or --adapters: the adapters; not both")
    check_out(out_dir, run_dir)
    source = Source(run_dir, which, settings)
    yours = added_by_user(out_dir, source.init)
    record: dict[str, Any] = {"run": run_dir.name, "step": source.ckpt.step, "weights": which}
    record |= {"dtype": dtype, "adapters": adapters, "module": module or None}
    from safetensors import SafetensorError  # noqa: PLC0415  (export only)

    mode = _new_file_mode()  # the folder itself is made by mkdir, which follows the umask
    try:
        with swapped_in(out_dir) as tmp:
            if adapters:
                list(_write_adapters(source, tmp, dtype))
            else:
                list(_write_model(source, tmp, dtype, shard_gb, module))
                if not module:  # the hub's config.json describes the whole model
                    list(_hub_files(source, tmp, dtype))
            (tmp / "config.toml").write_text(to_toml(source.cfg), encoding="utf-8")
            record["files"] = sorted([*(p.name for p in tmp.iterdir()), RECORD])
            (tmp / RECORD).write_text(json.dumps(record) + "\n", encoding="utf-8")
            for path in tmp.iterdir():  # only what export wrote: the user's files come next
                path.chmod(mode)
                with path.open("rb") as f:
                    os.fsync(f.fileno())
            _keep(yours, out_dir, tmp)
    except (OSError, SafetensorError) as err:
        if not _no_room(err):
            raise
        raise _written_fails(err, out_dir) from None
    return out_dir
