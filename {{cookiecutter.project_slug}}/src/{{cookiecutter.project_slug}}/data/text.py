"""Raw text files read for language models: UTF-8, or one line that says where it is not."""

from pathlib import Path

from ..errors import ConfigError, DataError


def read_utf8(path: Path) -> str:
    """The text of `path`; a byte that is not UTF-8 is named with its offset, in one line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}: not UTF-8 text at byte {err.start} ({err.reason}, "
            f"0x{data[err.start]:02x}); convert it, e.g. `iconv -f latin1 -t utf-8`"
        ) from None


def raw_text(raw_dir: Path, name: str, field: str) -> Path:
    """The file `name` below `raw_dir`; refused (naming `field`) when it points elsewhere.

    The raw data's manifest and guard cover `data/raw` only: a text read from elsewhere (an
    absolute path, `..`) would train on data that nothing records or checks.
    """
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise ConfigError(
            f"{field}: {name!r} lies outside data/raw; put the text into {raw_dir} and name "
            "it from there (raw data is recorded and checked only there)"
        )
    path = raw_dir / relative
    if not path.is_file():
        raise DataError(f"{path} not found: {field} names a text file in data/raw")
    return path
