"""Many small files packed into a few large shards, read back by index without unpacking.

Parallel file systems are slow at opening thousands of small files and count every file
against an inode quota. `write_shards` packs the files' bytes as they are (e.g. encoded PNGs)
into `<split>-NNN.bin` files of about `shard_mb` MB and writes an index `<split>.index.pt`
(shard, offset and length of every item, and its target); `ShardReader` memory-maps the shards
and returns an item's bytes. Decoding stays in the data set, inside DataLoader workers.
"""

import mmap
from collections.abc import Sequence
from pathlib import Path

import torch


def write_shards(
    files: Sequence[Path | bytes],
    targets: torch.Tensor,
    out_dir: Path,
    split: str,
    shard_mb: float,
) -> int:
    """Pack `files` (in this order; an item may also be bytes) with their `targets`.

    Returns the number of shards.
    """
    limit = int(shard_mb * 2**20)
    shard_of, offsets, lengths = [], [], []
    shard, offset = 0, 0
    out = (out_dir / f"{split}-{shard:03d}.bin").open("wb")
    try:
        for path in files:
            payload = path if isinstance(path, bytes) else path.read_bytes()
            if offset and offset + len(payload) > limit:
                out.close()
                shard, offset = shard + 1, 0
                out = (out_dir / f"{split}-{shard:03d}.bin").open("wb")
            out.write(payload)
            shard_of.append(shard)
            offsets.append(offset)
            lengths.append(len(payload))
            offset += len(payload)
    finally:
        out.close()
    index = {
        "shard": torch.tensor(shard_of, dtype=torch.int32),
        "offset": torch.tensor(offsets, dtype=torch.int64),
        "length": torch.tensor(lengths, dtype=torch.int64),
        "target": targets,
    }
    torch.save(index, out_dir / f"{split}.index.pt")
    return shard + 1


class ShardReader:
    """Item bytes and targets of one split; shards are opened on first use in each process."""

    def __init__(self, folder: Path, split: str) -> None:
        """Read the split's index (small); the shards stay closed until read."""
        self.folder, self.split = folder, split
        index_file = folder / f"{split}.index.pt"
        index = torch.load(index_file, map_location="cpu", weights_only=True, mmap=True)
        self.shard = index["shard"].tolist()
        self.offset = index["offset"].tolist()
        self.length = index["length"].tolist()
        self.targets: torch.Tensor = index["target"]
        self._maps: dict[int, mmap.mmap] = {}

    def __len__(self) -> int:
        """Items in the split."""
        return len(self.shard)

    def read(self, i: int) -> bytes:
        """The bytes of item `i`, as they were packed."""
        shard = self.shard[i]
        if shard not in self._maps:
            with (self.folder / f"{self.split}-{shard:03d}.bin").open("rb") as f:
                self._maps[shard] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        start = self.offset[i]
        return self._maps[shard][start : start + self.length[i]]

    def __getstate__(self) -> dict[str, object]:
        """Picklable for DataLoader workers (spawn): open maps are not sent along."""
        return {**self.__dict__, "_maps": {}}
