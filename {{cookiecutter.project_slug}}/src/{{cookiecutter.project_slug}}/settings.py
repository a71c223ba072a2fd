"""Paths and environment: the one place that reads `.env` and the path variables.

Every directory the package touches is derived here, so a job script, a container or a
colleague's laptop can move them with environment variables (or a `.env` file at the project
root) without code changes. `.env.example` lists every variable. The caches of the libraries
(Hugging Face, torch.hub) are placed here too, so they stay off the small home directory.
"""

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ProjectError

# Library caches that get_settings places when neither the environment nor `.env` sets them.
# XDG_CACHE_HOME is left alone: it moves the caches of every tool this process starts (pip,
# pre-commit, ...), and the ones the project uses are covered by these variables. Triton's and
# Inductor's caches are put on the node-local disk by the job scripts (slurm/common.sh).
CACHE_VARS = ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TORCH_HOME")


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
    """Return the directories for this process (after loading `.env`); place the caches."""
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
    _place_caches(settings)
    return settings


def _place_caches(settings: Settings) -> None:
    """Set CACHE_VARS in the environment: a set value (made absolute) wins, else a default.

    The libraries' own default is ~/.cache, in the home directory, whose quota on a cluster
    is small (tens of GB; 40 GB on Grete) and backed up: one data set or model can fill it.
    DATA_DIR is on project or work storage on a cluster (`.env.example`), so the defaults go
    below it.
    """
    root, cache = settings.project_root, settings.data_dir / ".cache"
    hf_home = _path_from_env("HF_HOME", cache / "huggingface", root)
    paths = {
        "HF_HOME": hf_home,
        # Pinned below the HF_HOME in effect (as the libraries derive them) so doctor and
        # child processes see the folder actually used.
        "HF_HUB_CACHE": _path_from_env("HF_HUB_CACHE", hf_home / "hub", root),
        "HF_DATASETS_CACHE": _path_from_env("HF_DATASETS_CACHE", hf_home / "datasets", root),
        "TORCH_HOME": _path_from_env("TORCH_HOME", cache / "torch", root),
    }
    os.environ.update({name: str(path) for name, path in paths.items()})


def library_caches() -> dict[str, Path]:
    """The cache folder of each of CACHE_VARS: its value, else the library's default."""
    env = os.environ
    xdg = Path(env.get("XDG_CACHE_HOME", "").strip() or "~/.cache").expanduser()
    hf_home = Path(env.get("HF_HOME", "").strip() or xdg / "huggingface").expanduser()
    defaults = {
        "HF_HOME": hf_home,
        "HF_HUB_CACHE": hf_home / "hub",
        "HF_DATASETS_CACHE": hf_home / "datasets",
        "TORCH_HOME": xdg / "torch",
    }
    return {
        name: Path(env.get(name, "").strip() or default).expanduser().absolute()
        for name, default in defaults.items()
    }
