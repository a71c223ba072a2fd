"""What processed data was made with: the settings and files that shaped it, checked on use.

Token shards cut by one tokenizer hold ids that mean other words under another, and windows
cut for one context length do not fit another. A task's `prepare` records what shaped its
data (`write_made_with`), and its `datasets` checks the run's values against the record
(`check_made_with`): a mismatch is refused in one line instead of training on data that means
something else. A key ending in `_from` names where a value came from (a folder); it is shown
in the message and not compared, so the same tokenizer in another folder is accepted.
"""

import hashlib
import json
from pathlib import Path

from ..errors import DataError

MADE_WITH = "made_with.json"
Value = str | int | float | bool


def write_made_with(out_dir: Path, values: dict[str, Value]) -> None:
    """Record `values` beside the processed data `prepare` writes into `out_dir`."""
    text = json.dumps(values, indent=1, sort_keys=True) + "\n"
    (out_dir / MADE_WITH).write_text(text, encoding="utf-8")


def check_made_with(data_dir: Path, task: str, values: dict[str, Value]) -> None:
    """Refuse processed data whose record differs from `values` (one line, the first key).

    Data prepared before the record existed has none: nothing to compare.
    """
    path = data_dir / MADE_WITH
    if not path.is_file():
        return
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(saved, dict):
            raise ValueError(f"holds {type(saved).__name__}, not an object")
    except (ValueError, UnicodeDecodeError) as err:
        raise DataError(
            f"{path}: unreadable ({err}); run `prepare task.name={task}` again"
        ) from None
    for key, value in values.items():
        if key.endswith("_from") or key not in saved or saved[key] == value:
            continue
        was = saved.get(f"{key}_from", saved[key])
        now = values.get(f"{key}_from", value)
        raise DataError(
            f"task {task}: its processed data was made with {key} {was!r}, this run has "
            f"{now!r}; run `prepare task.name={task}` with this run's settings, or train "
            "with those of the data"
        )


def files_digest(folder: Path, names: tuple[str, ...]) -> str:
    """SHA-256 over the files `names` of `folder` that exist (name and bytes of each)."""
    digest = hashlib.sha256()
    for name in sorted(names):
        path = folder / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()
