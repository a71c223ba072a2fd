"""Data files that arrived damaged (an interrupted download or copy): refused in one line.

A tar shard or a parquet file is read by a stream in the DataLoader workers; what is wrong with
it is said in one line that names the file: a parquet file's footer when the stream is made, a
tar shard's end and headers as it is read, a page's checksum where the file has them. Cuts of
a tar shard at every byte are in tests/test_stream_properties.py.
"""

import importlib.util
import random
import re
from pathlib import Path

import pytest
import torch

from conftest import pkg

tars, hf_streams, DataError = pkg("data.tars"), pkg("data.hf_streams"), pkg("errors").DataError
HAS_DATASETS = importlib.util.find_spec("datasets") is not None
needs_datasets = pytest.mark.skipif(not HAS_DATASETS, reason="the datasets extra is not installed")


def noise(size: int, seed: int) -> bytes:
    """Random bytes, the same every run."""
    return random.Random(seed).randbytes(size)  # noqa: S311  (damage, not secrets)


def one_line_naming(error: pytest.ExceptionInfo[Exception], path: Path) -> str:
    """The error's message, checked to be one line that begins with the file's path."""
    message = str(error.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    return message


def test_a_sample_its_decode_cannot_read_names_the_shard_and_the_sample(tmp_path: Path) -> None:
    samples = [{"__key__": f"{i:06d}", "x": bytes(8)} for i in range(5)]
    samples[3]["x"] = bytes(7)  # not a whole number of float32s
    [shard] = tars.write_tar_shards(samples, tmp_path, "s", 10)
    stream = tars.TarShards(
        [shard], lambda sample: torch.frombuffer(bytearray(sample["x"]), dtype=torch.float32)
    )
    with pytest.raises(DataError) as refused:
        list(stream)
    message = one_line_naming(refused, shard)
    assert message.startswith(f"{shard}: sample 000003: buffer length (7 bytes)"), message
    assert isinstance(refused.value.__cause__, ValueError)  # the traceback keeps the cause


@pytest.mark.parametrize("size", [0, 100, 511, 3 * 512, 20 * 512])
def test_random_bytes_in_place_of_a_tar_shard_are_one_line(tmp_path: Path, size: int) -> None:
    """Short ones included: less than a header once read as a shard of no samples."""
    shard = tmp_path / "train-000000.tar"
    shard.write_bytes(noise(size, seed=size))
    with pytest.raises(DataError) as refused:
        list(tars.read_tar(shard))
    one_line_naming(refused, shard)


def parquet_file(path: Path) -> Path:
    """300 rows of two columns (a list and an integer), written with page checksums."""
    rows = {"x": [[float(i)] * 8 for i in range(300)], "y": list(range(300))}
    return hf_streams.write_parquet(rows, path)


@needs_datasets
@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda data: data[: len(data) * 2 // 3], "not a parquet file or cut short (no footer)"),
        (lambda data: b"", "0 bytes"),
        (lambda data: noise(3000, seed=0), "not a parquet file or cut short"),
        (lambda data: data[:1000] + data[1100:], "column y of row group 0 lies at bytes"),
    ],
    ids=["cut to 2/3", "zero bytes", "random bytes", "100 bytes missing inside"],
)
def test_a_damaged_parquet_file_is_one_line_when_the_stream_is_made(
    tmp_path: Path, damage: object, says: str
) -> None:
    good, bad = parquet_file(tmp_path / "train-0.parquet"), tmp_path / "train-1.parquet"
    bad.write_bytes(damage(parquet_file(bad).read_bytes()))  # type: ignore[operator]
    with pytest.raises(DataError) as refused:
        hf_streams.hf_stream([good, bad])
    assert says in one_line_naming(refused, bad)


@needs_datasets
def test_a_missing_parquet_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"train-0\.parquet: no such file$"):
        hf_streams.hf_stream([tmp_path / "train-0.parquet"])
    with pytest.raises(DataError, match=r"^hf_stream: no files given"):  # an empty glob
        hf_streams.hf_stream(sorted(tmp_path.glob("*.parquet")))


@needs_datasets
def test_a_bit_flipped_in_a_page_with_a_checksum_is_refused_as_it_is_read(tmp_path: Path) -> None:
    """The footer is intact, so the stream is made; the page's CRC32 fails when it is read.

    pyarrow names no file ('<Buffer>'): the stream checks the files it opened while reading
    (as training reads, `failures.reading()`) and names the damaged one.
    """
    import pyarrow.parquet as pq  # noqa: PLC0415  (with the datasets extra)

    path = parquet_file(tmp_path / "train-0.parquet")
    assert len(list(hf_streams.hf_stream([path]))) == 300
    y = pq.read_metadata(path).row_group(0).column(1)  # a dictionary page, then a data page
    data = bytearray(path.read_bytes())
    data[y.dictionary_page_offset + y.total_compressed_size - 2] ^= 0x10  # the data page's body
    path.write_bytes(bytes(data))
    stream = hf_streams.hf_stream([path])
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        list(stream)  # read outside training: the error as pyarrow raises it
    named = rf"^{re.escape(str(path))}: OSError: .*CRC checksum verification failed"
    with pytest.raises(DataError, match=named), pkg("data.failures").reading():
        list(hf_streams.hf_stream([path]))
