"""notebooks/tutorial.ipynb: stored without outputs, and it runs top to bottom in a kernel.

The kernel is this environment's Python (the one running the tests), registered in a scratch
folder: a `python3` kernel of the user's own Jupyter setup may be another Python. The
notebook runs in a scratch copy of the project, so its runs and figures land there.
"""

import csv
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import DEV_ONLY, DIGITS, PACKAGE, ROOT, cli_env, example_task, pkg

pytest.importorskip("nbclient", reason=DEV_ONLY)
import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

NOTEBOOK = ROOT / "notebooks" / "tutorial.ipynb"


def read_notebook() -> nbformat.NotebookNode:
    """The tutorial notebook, or a skip where the project has none (baked without the example)."""
    if not NOTEBOOK.is_file():
        pytest.skip("notebooks/tutorial.ipynb comes with the digits example")
    return nbformat.read(NOTEBOOK, as_version=4)


def test_notebook_is_stored_as_nbstripout_leaves_it() -> None:
    notebook = read_notebook()
    nbformat.validate(notebook)
    for index, cell in enumerate(notebook.cells):
        assert cell.id == str(index)  # nbstripout numbers the cells
        assert cell.metadata == {}
        if cell.cell_type == "code":
            assert cell.outputs == []
            assert cell.execution_count is None
    assert set(notebook.metadata) <= {"kernelspec", "language_info"}
    # Opened in Jupyter, it asks for the kernel `make kernel` registers: the package's name.
    assert notebook.metadata.kernelspec.name == PACKAGE


def test_notebook_trains_stops_and_resumes(
    project: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    notebook = read_notebook()
    if not example_task("digits"):  # the notebook walks through the digits example
        pytest.skip("the digits example is not part of this project (any more)")
    # A scratch project: its root found from the notebook's folder (no PROJECT_ROOT), and
    # DATA_DIR elsewhere, as a job's .env may move it.
    data = tmp_path_factory.mktemp("data")
    (data / "raw").mkdir()
    shutil.copy2(DIGITS, data / "raw")
    shutil.copy2(ROOT / "pyproject.toml", project)
    shutil.copytree(ROOT / "configs", project / "configs")
    (project / "notebooks").mkdir()
    (project / "data").mkdir()  # for the manifest, data/raw.manifest.tsv
    monkeypatch.setenv("DATA_DIR", str(data))
    assert pkg("cli").main(["data", "freeze"]) == 0  # the scratch data's own manifest

    jupyter = tmp_path_factory.mktemp("jupyter")
    spec = jupyter / "kernels" / "this-python"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "this-python", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(jupyter / "runtime"))  # connection files
    env = cli_env(project, {"DATA_DIR": str(data), "IPYTHONDIR": str(jupyter / "ipython")})
    del env["PROJECT_ROOT"]
    manager = AsyncKernelManager(
        kernel_name="this-python",
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(jupyter / "kernels")]),
    )
    client = NotebookClient(
        notebook, km=manager, resources={"metadata": {"path": str(project / "notebooks")}}
    )
    # A failing cell raises CellExecutionError with its traceback. cleanup_kc: shut the
    # kernel down at the end, which nbclient leaves to the owner of a manager passed in.
    client.execute(cleanup_kc=True, env=env)

    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    text = "".join(output.get("text", "") for output in outputs)
    stopped = re.search(r"segment done at step (\d+); the next start resumes", text)
    assert stopped, text[-3000:]
    assert f"resumed from step {stopped[1]} " in text

    (run,) = (project / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert summary["step"] == summary["total_steps"] > int(stopped[1])
    with (run / "metrics.csv").open(newline="") as file:
        logged = [int(row["step"]) for row in csv.DictReader(file) if row["phase"] == "train"]
    assert logged == list(range(10, summary["step"] + 1, 10))  # none twice, none missing
    assert json.loads((run / "evaluation.json").read_text())["accuracy"] > 0.8
    figures = project / "reports" / "figures" / run.name
    assert {"curves.png", "confusion_matrix_test.png"} <= {p.name for p in figures.iterdir()}
    assert sum("image/png" in output.get("data", {}) for output in outputs) >= 2
    # The data went where DATA_DIR points, not into the project.
    assert (data / "processed" / "digits").is_dir()
    assert not (project / "data" / "processed").exists()
