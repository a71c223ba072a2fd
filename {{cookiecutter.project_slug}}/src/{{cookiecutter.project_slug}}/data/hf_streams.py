"""Hugging Face `datasets` streams (`datasets.IterableDataset`), split by process, resumed exactly.

`hf_stream` wraps a streaming data set, e.g. `load_dataset("parquet", data_files=..., split=
"train", streaming=True)` over local Arrow or parquet files. Each process reads its share
(`split_dataset_by_node`: whole files when their count divides by the process count, else
every process reads all and keeps its rows); `datasets` deals each process's files out to its
DataLoader workers. Two routes to an exact resume, chosen by the shuffle:

- no shuffle buffer: the data set's own `state_dict()` (the file and the row in it), saved per
  worker and process and loaded before the next `iter`. A resume re-reads the current file up
  to that row, nothing before it.
- `shuffle_buffer > 0`: `datasets` saves no buffer contents and refills the buffer on resume
  ("without the buffer content"), which changes the order. So this route has no state: each
  epoch's order is fixed by `seed` and the epoch (`set_epoch`), and a resume replays the epoch
  from its start, throwing away what was used. It costs reading that part of the epoch again.

`datasets` (the `datasets` extra) is imported when a stream is made, not before.
"""

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from torch.utils.data import IterableDataset

from .streams import stream_part


class _HFStream(IterableDataset):
    """What both routes share: the split by process, the epoch, the sample transform."""

    def __init__(
        self,
        dataset: Any,
        files: list[Path],
        shuffle_buffer: int,
        seed: int,
        transform: Callable[[dict[str, Any]], Any] | None,
    ) -> None:
        self.dataset, self.files, self.buffer, self.seed = dataset, files, shuffle_buffer, seed
        self.transform, self.epoch = transform, 0
        self._live: Any = None  # the split data set being read
        self._pending: Mapping[str, Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (the shuffle's seed is seed + epoch)."""
        self.epoch = epoch

    def source_files(self) -> list[Path]:
        """The local files the stream reads (for the data digest in checkpoints)."""
        return list(self.files)

    def __iter__(self) -> Iterator[Any]:
        """This process's rows (this worker's files of them), transformed."""
        from datasets.distributed import split_dataset_by_node  # noqa: PLC0415  (an extra)

        part = stream_part()
        live = self.dataset
        if part.world > 1:
            live = split_dataset_by_node(live, rank=part.rank, world_size=part.world)
        if self.buffer:
            live = live.shuffle(seed=self.seed, buffer_size=self.buffer)
        live.set_epoch(self.epoch)
        if self._pending is not None:
            live.load_state_dict(self._pending)
            self._pending = None
        self._live = live
        for row in live:
            yield self.transform(row) if self.transform else row


class HFStreamWithState(_HFStream):
    """The unshuffled route: `datasets`' own position, saved and loaded."""

    def state_dict(self) -> dict[str, Any]:
        """The position after the last row yielded (file and row)."""
        return self._live.state_dict() if self._live is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state` at the next `iter`."""
        self._pending = state or None


def hf_stream(
    files: list[Path],
    *,
    file_format: str = "parquet",
    shuffle_buffer: int = 0,
    seed: int = 0,
    transform: Callable[[dict[str, Any]], Any] | None = None,
    **load_options: Any,
) -> IterableDataset:
    """A stream of the rows of local `files` (parquet, arrow, json, csv), ready for training.

    `shuffle_buffer` > 0 shuffles the file order and the rows through a buffer of that many
    (seeded by `seed` and the epoch); `transform` turns each row (a dict) into a sample.
    """
    from datasets import load_dataset  # noqa: PLC0415  (an optional extra)

    paths = [str(p) for p in files]
    data = load_dataset(
        file_format, data_files=paths, split="train", streaming=True, **load_options
    )
    kind = _HFStream if shuffle_buffer else HFStreamWithState
    return kind(data, list(files), shuffle_buffer, seed, transform)
