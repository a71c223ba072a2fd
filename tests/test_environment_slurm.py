"""`make container` on a real one-node Slurm: the image build job as a user submits it.

The local Slurm (tests/slurm/localslurm.py) carries every partition and GPU type of the
presets, so container/build.sh is submitted with its generated #SBATCH header unchanged.
A stand-in `apptainer` (envcases.FAKE_APPTAINER) does the build: no engine runs here.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from engines import ROOT, Bake
from envcases import CASES, answers_of, baked, install_fake_apptainer, run, working_copy
from slurm.localslurm import (
    LocalSlurm,
    gpu_types_from_presets,
    load_presets,
    partitions_from_presets,
)
from slurm.project import require_slurm

pytestmark = pytest.mark.slurm

PRESETS = load_presets(ROOT / "presets")
APPTAINER_CASES = sorted(c for c in CASES if answers_of(c)["environment"] == "apptainer")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalSlurm]:
    require_slurm()
    root = Path(tempfile.mkdtemp(prefix="slurm-env-", dir="/tmp"))
    instance = LocalSlurm(
        root, partitions=partitions_from_presets(PRESETS), gpus=gpu_types_from_presets(PRESETS)
    )
    instance.start()
    yield instance
    instance.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=APPTAINER_CASES)
def case(
    request: pytest.FixtureRequest, template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Bake:
    return baked(request.param, template, tmp_path_factory)


def test_make_container_builds_the_image_in_a_job(
    cluster: LocalSlurm, case: Bake, tmp_path: Path
) -> None:
    project = working_copy(case.project, tmp_path)
    slug = project.name
    test_only = cluster.run("sbatch", "--test-only", "container/build.sh", cwd=project, check=False)
    assert test_only.returncode == 0, test_only.stderr
    assert "to start at" in test_only.stderr
    # sbatch passes the submitting shell's environment to the job: the stand-in comes along.
    fake_bin = install_fake_apptainer(tmp_path / "fakebin")
    env: dict[str, str | None] = {
        **cluster.env,
        "PATH": f"{fake_bin}:{cluster.env['PATH']}",
        "FAKE_APPTAINER_LOG": str(tmp_path / "apptainer.log"),
        "APPTAINER_CACHEDIR": None,
        "APPTAINER_TMPDIR": None,
    }
    done = run(["make", "container"], project, env)
    assert done.returncode == 0, done.stdout + done.stderr
    job = re.search(r"Submitted batch job (\d+)", done.stdout)
    assert job, done.stdout
    cluster.wait(job[1])
    log = project / "logs" / f"{slug}-build-{job[1]}.out"
    assert cluster.job(job[1]).get("JobState") == "COMPLETED", log.read_text()
    assert f"built container/{slug}.sif" in log.read_text()
    assert (project / "container" / f"{slug}.sif").read_text() == "image\n"
    calls = (tmp_path / "apptainer.log").read_text().splitlines()
    assert f"cwd={project}" in calls
    assert any(c.startswith("args=build --fakeroot ") for c in calls)
