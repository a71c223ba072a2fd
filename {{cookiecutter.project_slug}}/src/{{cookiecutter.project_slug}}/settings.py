"""Paths and environment: the one place that reads `.env` and the path variables.

Every directory the package touches is derived here, so a job script, a container or a
colleague's laptop can move them with environment variables (or a `.env` file at the project
root) without code changes. `.env.example` lists every variable.
"""

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ProjectError


@dataclass(frozen=True)
class Settings:
    """Resolved locations of the project's directories."""

    project_root: Path
    data_dir: Path
    runs_dir: Path

    @property
    def raw_dir(self) -> Path:
        """Raw data: read-only input, guarded by the raw-data manifest."""
        return self.data_dir / "raw"

    @property
    def processed_dir(self) -> Path:
        """Output of `prepare`, input of `train` and `evaluate`."""
        return self.data_dir / "processed"

    @property
    def figures_dir(self) -> Path:
        """Figures for reports; each run writes into its own sub-directory."""
        return self.project_root / "reports" / "figures"


def _path_from_env(name: str, default: Path, root: Path) -> Path:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    path = Path(value).expanduser()
    return path if path.is_absolute() else root / path


@functools.cache
def load_dotenv_once() -> None:
    """Load `.env` from the project root once per process; real variables win over the file."""
    from dotenv import load_dotenv  # noqa: PLC0415  (keeps `--help` free of it)

    root = Path(os.environ.get("PROJECT_ROOT") or Path.cwd())
    try:
        load_dotenv(root / ".env", override=False)
    except UnicodeDecodeError:
        raise ProjectError(f"{root / '.env'}: not UTF-8 text; save it as UTF-8") from None
    except OSError as err:
        raise ProjectError(f"{root / '.env'}: cannot be read: {err.strerror}") from None


def get_settings() -> Settings:
    """Return the directories for this process (after loading `.env`)."""
    load_dotenv_once()
    root = Path(os.environ.get("PROJECT_ROOT") or Path.cwd()).expanduser().resolve()
    settings = Settings(
        project_root=root,
        data_dir=_path_from_env("DATA_DIR", root / "data", root),
        runs_dir=_path_from_env("RUNS_DIR", root / "runs", root),
    )
    for name, path in (("DATA_DIR", settings.data_dir), ("RUNS_DIR", settings.runs_dir)):
        if path.exists() and not path.is_dir():
            raise ProjectError(f"{name} {path}: is a file, not a folder")
    return settings
