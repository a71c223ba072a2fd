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

Parquet files are checked when the stream is made, in the training process, before a worker
reads them (`check_parquet`: the footer, the row count, where the column chunks lie), and a
page's CRC32 is verified as it is read where the file has one; `write_parquet` writes them.

`datasets` (the `datasets` extra, with pyarrow) is imported when a stream is made, not before.
"""

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from torch.utils.data import IterableDataset

from ..errors import DataError, first_line
from . import failures
from .streams import stream_part


class _HFStream(IterableDataset):
    """What both routes share: the split by process, the epoch, the sample transform."""

    # Imported by the fork server of the DataLoader workers before it forks them (see
    # `engine.loop.stream_batches.fork_server`): once per run, not once per worker and pass.
    worker_modules = ("datasets", "datasets.distributed", "pyarrow.parquet")

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
        try:
            for row in live:
                yield self.transform(row) if self.transform else row
        except DataError:
            raise
        except Exception as err:  # pyarrow names no file ('<Buffer>'): find it, if damaged
            if (damaged := self._damaged()) is None:
                raise
            raise DataError(f"{damaged}: {failures.kind(err)}: {first_line(err)}") from err

    def _damaged(self) -> Path | None:
        """Of the parquet files this process opened (newest first), the first one damaged.

        Each is read whole with its page checksums verified: slow for large files, but this
        runs only after reading failed, and `datasets` may read several files in turn, so the
        file opened last need not be the one that failed.
        """
        import pyarrow.parquet as pq  # noqa: PLC0415  (an extra)

        mine = {str(Path(file).resolve()): Path(file) for file in self.files}
        for opened in failures.opened():
            path = mine.get(str(Path(opened).resolve()))
            if path is None or path.suffix != ".parquet":
                continue
            try:
                parquet = pq.ParquetFile(path, page_checksum_verification=True)
                for group in range(parquet.num_row_groups):
                    parquet.read_row_group(group)
            except Exception:  # any failure of this file: it is the damaged one
                return path
        return None


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
    Parquet files are checked here (`check_parquet`): a damaged one is refused in one line.
    """
    from datasets import load_dataset  # noqa: PLC0415  (an optional extra)

    if not files:  # datasets' own "Empty 'data_files'" comes with a traceback
        raise DataError("hf_stream: no files given (did the glob find any?)")
    if file_format == "parquet":
        from pyarrow.dataset import ParquetFragmentScanOptions  # noqa: PLC0415  (an extra)

        for path in files:
            check_parquet(Path(path))
        # Pages written with a CRC32 (`write_parquet`) are verified as they are read; pages
        # without one are read as they are. A caller's own scan options are kept.
        verify = ParquetFragmentScanOptions(page_checksum_verification=True)
        load_options.setdefault("fragment_scan_options", verify)
    paths = [str(p) for p in files]
    data = load_dataset(
        file_format, data_files=paths, split="train", streaming=True, **load_options
    )
    kind = _HFStream if shuffle_buffer else HFStreamWithState
    return kind(data, list(files), shuffle_buffer, seed, transform)


def check_parquet(path: Path) -> None:
    """One line when `path` is not a whole parquet file; only its footer is read.

    The footer (file metadata, before the last 8 bytes) says how many rows the file holds and
    where each column chunk lies: a cut file has lost it, and a file with bytes missing inside
    has chunks that run into it. What the footer cannot show (a changed byte inside a page)
    is found as the page is read, where the page has a checksum (`write_parquet`).
    """
    import pyarrow.parquet as pq  # noqa: PLC0415  (an extra)

    if not path.is_file():
        raise DataError(f"{path}: no such file")
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"{path}: 0 bytes, not a parquet file (an interrupted download or copy?)")
    try:
        meta = pq.read_metadata(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(
            f"{path}: not a parquet file or cut short (no footer): {first_line(err)}"
        ) from err
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    if (rows := sum(group.num_rows for group in groups)) != meta.num_rows:
        raise DataError(f"{path}: its row groups hold {rows} rows, its footer says {meta.num_rows}")
    with path.open("rb") as f:  # the footer's length, in the 4 bytes before the closing magic
        f.seek(size - 8)
        data_end = size - 8 - int.from_bytes(f.read(4), "little")
    for index, group in enumerate(groups):
        for column in (group.column(i) for i in range(group.num_columns)):
            start = column.data_page_offset  # a dictionary page comes first, where there is one
            if column.has_dictionary_page and 0 < column.dictionary_page_offset < start:
                start = column.dictionary_page_offset
            if not 4 <= start <= start + column.total_compressed_size <= data_end:
                raise DataError(
                    f"{path}: column {column.path_in_schema} of row group {index} lies at bytes "
                    f"{start}-{start + column.total_compressed_size}, outside the data (bytes "
                    f"4-{data_end}): bytes are missing or the footer is damaged"
                )


def write_parquet(table_or_rows: Any, path: Path) -> Path:
    """Write a pyarrow Table, a dict of column -> values or a list of rows (dicts) to `path`.

    Every page carries a CRC32 of its bytes (`write_page_checksum`), which `hf_stream` verifies
    as it reads: a changed byte in a page is refused, where without one it can train silently.
    """
    import pyarrow as pa  # noqa: PLC0415  (an extra)
    import pyarrow.parquet as pq  # noqa: PLC0415

    table = table_or_rows
    if isinstance(table, Mapping):
        table = pa.table(dict(table))
    elif not isinstance(table, pa.Table):
        table = pa.Table.from_pylist(list(table))
    pq.write_table(table, path, write_page_checksum=True)
    return path
