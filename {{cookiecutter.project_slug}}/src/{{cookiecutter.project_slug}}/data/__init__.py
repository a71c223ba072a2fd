"""Data: from the immutable raw files to the batches' bytes, and pretrained weights.

The raw-data guard (`rawdata`, `manifest`, `rawdata_hook`), the record of the files streams
read from elsewhere (`sources`), processed data written all-or-nothing and staged to
node-local disk (`processed`), shards of many small files (`shards`), streams that resume
exactly (`streams`; tar shards in `tars`, Hugging Face streams in `hf_streams`), pretrained
weights (`pretrained`) and the file-digest cache (`hashcache`).

May import: the seam (`task`, `config`, `errors`, `settings`). Never: `engine`, `observe`,
`experiments`, `ops`, `tasks`.
"""

from importlib import import_module
from typing import Any

from .. import moved

# Until template release 0.2.0 this package was the module `data.py` (now `processed.py`).
# Its names still import from here, with a warning, for one release.
_MOVED = frozenset({
    "check_same_data", "prepare", "processed_digest", "read_digests", "stage", "swapped_in",
    "verify", "write_digests",
})  # fmt: skip


def __getattr__(name: str) -> Any:
    """The names of the former `data.py`, with a warning that says where they went."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    moved.warn(f"{__name__}.{name}", "data.processed")
    return getattr(import_module(".processed", __name__), name)
