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
JSON, a file that is none of these formats. The line starts with the setting that named the
path: `model.init_from` for the training start's weights (its callers say so), the `[task]`
option whose value is the path for task code (`task.teacher: no file ...`), and none when no
setting holds it (`no weights file ...`): never a setting the user did not set.

`read_weights` returns every tensor at once (for one process that needs the whole model, e.g.
`export`). `WeightFiles` reads tensor by tensor and slice by slice: the training start uses it,
so under fsdp each process reads only the slices it keeps (safetensors files are memory-mapped:
a slice costs its own bytes, never the whole file).
"""

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FIELD = "model.init_from"
# The options of the task in play (`Task.__init__` sets them): task code hands `read_weights`
# a path alone, and the option that held it is found here by its value.
_task_options: object = None
# safetensors' names of the floating dtypes (its header's "dtype").
_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
}


def set_task_options(options: object) -> None:
    """Keep the options of the task in play, where `read_weights` finds the one with a path."""
    global _task_options  # noqa: PLW0603  (one task per process; Task.__init__ sets it)
    _task_options = options


def _option_holding(path: Path) -> str:
    """`task.<option>` whose value is `path` or its end (joined to a folder); "" if none."""
    for name, value in getattr(_task_options, "__dict__", {}).items():
        parts = Path(value).parts if isinstance(value, str | Path) else ()
        if parts and path.parts[-len(parts) :] == parts:
            return f"task.{name}"
    return ""


def _refused(setting: str, problem: str) -> ConfigError:
    """One line: the setting that named the path first, when one did."""
    return ConfigError(f"{setting}: {problem}" if setting else problem)


def _pickled(path: Path, setting: str) -> dict[str, torch.Tensor]:
    try:
        weights = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # any unreadable file: one line, not a traceback
        raise _refused(
            setting, f"{path} is not a safetensors or PyTorch weights file: {err}"
        ) from None
    if isinstance(weights, dict) and isinstance(weights.get("model"), dict):
        weights = weights["model"]  # a checkpoint of another run
    if not isinstance(weights, dict):
        raise _refused(setting, f"{path} holds a {type(weights).__name__}, not a state dict")
    return weights


def read_weights(path: Path, setting: str | None = None) -> dict[str, torch.Tensor]:
    """The state dict stored at `path` (a file or a model folder), on the CPU.

    `setting`: the setting that named `path`, which an error line names (`model.init_from`).
    None, as task code calls it: the task option whose value is `path`, if one is.
    """
    files = WeightFiles(path, _option_holding(path) if setting is None else setting)
    return files.tensors(sorted(files.names()))


class WeightFiles:
    """The tensors at `path` by name, read one slice at a time (nothing is read up front).

    safetensors files (one, or a folder with or without its index) are opened lazily and
    read slice by slice; a PyTorch file is memory-mapped, so a slice reads its own pages.
    """

    def __init__(self, path: Path, setting: str) -> None:
        """Read the headers (names, shapes, dtypes) of every file; one line for a bad path.

        `setting`: the setting that named `path`, first in that line ("": none did).
        """
        self.path, self.setting = path, setting
        self._open: dict[Path, Any] = {}
        self._pickled: dict[str, torch.Tensor] | None = None
        self.where: dict[str, Path] = {}  # tensor name -> its safetensors file
        if path.is_dir():
            self._folder(path)
        elif not path.is_file():
            raise _refused(setting, f"no file {path}" if setting else f"no weights file {path}")
        elif path.suffix == ".safetensors":
            self._add(path, None)
        else:
            self._pickled = _pickled(path, setting)

    def _folder(self, folder: Path) -> None:
        index = folder / INDEX
        if not index.is_file():
            if not (folder / SINGLE).is_file():
                raise _refused(self.setting, f"folder {folder} has neither {INDEX} nor {SINGLE}")
            self._add(folder / SINGLE, None)
            return
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (ValueError, KeyError, TypeError) as err:
            raise _refused(self.setting, f"{index} has no valid weight_map: {err}") from None
        if not isinstance(weight_map, dict):
            raise _refused(self.setting, f"{index}: weight_map must map tensor names to files")
        for shard in sorted(set(weight_map.values())):
            if not (folder / shard).is_file():
                raise _refused(self.setting, f"shard {shard} named in {index} is missing")
            self._add(folder / shard, {k for k, v in weight_map.items() if v == shard})

    def _add(self, file: Path, wanted: set[str] | None) -> None:
        # Imported here: only runs that read safetensors pay for the import.
        from safetensors import SafetensorError, safe_open  # noqa: PLC0415

        try:
            handle = safe_open(file, framework="pt", device="cpu")
        except (SafetensorError, OSError) as err:
            raise _refused(self.setting, f"{file} is not a safetensors file: {err}") from None
        names = set(handle.keys())
        if wanted is not None and (absent := sorted(wanted - names)):
            problem = f"{file} lacks {absent[0]}, which {INDEX} puts there"
            raise _refused(self.setting, problem)
        self._open[file] = handle
        self.where.update(dict.fromkeys(sorted(names if wanted is None else wanted), file))

    def names(self) -> set[str]:
        """Every tensor name the files hold."""
        return set(self._pickled) if self._pickled is not None else set(self.where)

    def shape(self, name: str) -> list[int]:
        """The whole tensor's shape, from the header."""
        if self._pickled is not None:
            return list(self._pickled[name].shape)
        return list(self._open[self.where[name]].get_slice(name).get_shape())

    def dtype(self, name: str) -> torch.dtype | None:
        """The stored dtype of tensor `name` (None: one this reader does not name)."""
        if self._pickled is not None:
            return self._pickled[name].dtype
        stored = self._open[self.where[name]].get_slice(name).get_dtype()
        return _SAFETENSORS_DTYPES.get(stored)

    def read(self, name: str, index: tuple[slice, ...]) -> torch.Tensor:
        """The part `index` (one slice per dimension) of tensor `name`."""
        if self._pickled is not None:
            return self._pickled[name][index]
        handle = self._open[self.where[name]]
        # A 0-dim tensor (a scalar buffer) takes no slice: read it whole.
        return handle.get_slice(name)[index] if index else handle.get_tensor(name)

    def tensors(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """Whole tensors `names` (a few at a time: for streaming, not for a whole model)."""
        return {
            name: self.read(name, tuple(slice(0, n) for n in self.shape(name))) for name in names
        }
