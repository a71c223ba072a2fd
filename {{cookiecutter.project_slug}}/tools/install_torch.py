"""Install torch's build for one variant (cpu, cu126, ...) from one wheel index, or refuse.

`make install` runs it before it installs the project. pip takes the highest version among
every index it knows, and where pip's configuration or ``PIP_EXTRA_INDEX_URL`` names a site
mirror, that can be a CUDA build of a newer torch (a ``+cu130`` label sorts above ``+cpu``):
a laptop would get gigabytes it cannot use. So for this one install no other index is read
(find-links, proxy and certificates stay as configured), and pip's choice is checked before
anything large is installed: a dry run names the wheel, whose label must be the variant's.

Standard library only: it runs with the fresh environment's Python.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REQUIREMENT = "torch>=2.4,<3"  # the project's own range (pyproject.toml)


def pip(
    python: str, index: str, *args: str, capture: bool = True
) -> subprocess.CompletedProcess[str]:
    """`python -m pip ... --index-url index`, with no other index.

    The environment variable is read after every pip.conf and replaces their extra indexes;
    it names the same index again, as pip drops an empty value and reads the files' instead.
    """
    env = {**os.environ, "PIP_EXTRA_INDEX_URL": index}
    command = [python, "-m", "pip", *args, "--index-url", index]
    return subprocess.run(  # noqa: S603  (pip of the environment being built)
        command, env=env, capture_output=capture, text=True, check=False
    )


def fits(version: str, variant: str, platform: str = sys.platform) -> bool:
    """Whether torch `version` is the `variant` build (macOS wheels carry no label: CPU)."""
    label = version.partition("+")[2]
    return label == variant or (variant == "cpu" and not label and platform == "darwin")


def main(argv: list[str] | None = None) -> int:
    """Check pip's choice for the variant, then install it; one line when it is not."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", help="cpu, cu126, ...: the label torch's version carries")
    parser.add_argument("index", help="the wheel index of that variant")
    parser.add_argument("--python", default=sys.executable, help="the environment's Python")
    args = parser.parse_args(argv)
    where = f"--index-url {args.index}"
    look = pip(args.python, args.index, "install", "--dry-run", "--quiet", "--no-deps",
               "--report", "-", REQUIREMENT)  # fmt: skip
    try:
        wheel = json.loads(look.stdout)["install"][0]
        version, url = wheel["metadata"]["version"], wheel["download_info"]["url"]
    except (ValueError, KeyError, IndexError, TypeError):
        said = [line for line in look.stderr.splitlines() if line.strip()] or ["no answer"]
        print(f"make install: pip finds no {REQUIREMENT} at {where}: {said[-1]}", file=sys.stderr)
        return 1
    if not fits(version, args.variant):
        print(
            f"make install: pip would take torch {version} ({url}), not the {args.variant} "
            f"build of {where}; nothing was installed. Name a mirror of that index with "
            "TORCH_INDEX=<url>, or take the wheel out of pip's find-links (pip config list)",
            file=sys.stderr,
        )
        return 1
    print(f"torch {version} ({args.variant}) from {url}", flush=True)
    exact = f"torch=={version}"  # what the dry run chose, whatever appears meanwhile
    return pip(args.python, args.index, "install", "--no-deps", exact, capture=False).returncode


if __name__ == "__main__":
    sys.exit(main())
