"""`compare` on real runs, and what packed runs share: GPU hours, memory budget, CPU cores."""

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import PACKAGE, ROOT, blobs, cli_env, pkg

trainer, compare, runtime, cli = (
    pkg("engine.loop.trainer"),
    pkg("experiments.compare"),
    pkg("engine.parallel.runtime"),
    pkg("cli"),
)
distributed = pkg("engine.parallel.distributed")

FAST = ["run.progress=log", "run.figures=false", "data.verify_raw=false", "train.batch_size=32"]
BEST = ["run.best_metric=accuracy", "run.best_mode=max", "run.val_every_steps=5"]


def train(*overrides: str) -> dict:
    task = blobs(*FAST, *BEST, "train.epochs=2", *overrides, features=2, classes=6)
    return trainer.train(task.cfg, task).summary


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three runs of one small sweep: finished, stopped then resumed (2 segments), stopped."""
    root = tmp_path_factory.mktemp("compare")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROJECT_ROOT", str(root))
        for var in ("RUNS_DIR", "RUN_NAME", "PACKED_RUNS", "SLURM_JOB_ID"):
            mp.delenv(var, raising=False)
        train("run.name=lr-fast", "train.lr=0.01")
        # The resumed run is charged 2 GPUs in its first segment and half of one (packed
        # two to a GPU) in its second: its GPU hours must add the two segments up.
        mp.setattr(trainer, "billed_gpus", lambda *_a: 2.0)
        train("run.name=lr-slow", "train.lr=0.001", "run.max_steps_this_segment=10")
        mp.setattr(trainer, "billed_gpus", lambda *_a: 0.5)
        train("run.name=lr-slow", "train.lr=0.001")
        mp.undo()
        mp.setenv("PROJECT_ROOT", str(root))
        train("run.name=lr-cut", "train.lr=0.003", "run.max_steps_this_segment=7")
    return root / "runs"


def val_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as f:
        return [r for r in csv.DictReader(f) if r["phase"] == "val"]


def test_table_has_differing_settings_best_values_and_segment_totals(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = compare.run_compare(runs, tmp_path, [], figure=False)
    out = capsys.readouterr().out
    by_name = {r.name: r for r in table}
    assert set(by_name) == {"lr-fast", "lr-slow", "lr-cut"}
    assert compare.differing(table) == ["run.max_steps_this_segment", "train.lr"]
    # Ranked by accuracy (the runs' run.best_metric, max), best first.
    accuracies = [r.best["accuracy"][0] for r in table]
    assert accuracies == sorted(accuracies, reverse=True)
    assert "best accuracy (max) first" in out
    for run in table:  # best and final values and the step of the best, from metrics.csv
        rows = val_rows(runs / run.name)
        values = [(float(r["accuracy"]), int(r["step"])) for r in rows]
        top = max(v for v, _ in values)
        assert run.best["accuracy"] == (top, next(s for v, s in values if v == top))
        losses = [(float(r["loss"]), int(r["step"])) for r in rows]
        low = min(v for v, _ in losses)
        assert run.best["loss"] == (low, next(s for v, s in losses if v == low))
        assert run.final["loss"] == losses[-1][0]
    assert [by_name[n].status for n in ("lr-fast", "lr-slow", "lr-cut")] == [
        "finished",
        "finished",
        "stopped",
    ]
    assert [by_name[n].segments for n in ("lr-fast", "lr-slow", "lr-cut")] == [1, 2, 1]
    assert (by_name["lr-slow"].step, by_name["lr-cut"].step) == (26, 7)
    slow = json.loads((runs / "lr-slow" / "summary.json").read_text())
    whole, last = slow["whole_run"]["wall_s"], slow["wall_s"]
    assert whole > last  # both segments
    assert by_name["lr-slow"].wall_h == pytest.approx(whole / 3600)
    assert by_name["lr-slow"].gpu_h * 3600 == pytest.approx(
        2 * (whole - last) + 0.5 * last, abs=0.01
    )
    assert by_name["lr-fast"].gpu_h == 0  # the CPU outside a Slurm job: no GPU charged
    # The same table as CSV and Markdown, in the ranked order.
    with (tmp_path / "compare.csv").open() as f:
        written = list(csv.DictReader(f))
    assert [r["run"] for r in written] == [r.name for r in table]
    assert written[0]["train.lr"] == by_name[written[0]["run"]].settings["train.lr"]
    assert written[0]["segments"] == str(by_name[written[0]["run"]].segments)
    markdown = (tmp_path / "compare.md").read_text().splitlines()
    assert markdown[0].startswith("| run | status | run.max_steps_this_segment | train.lr |")
    assert len(markdown) == 2 + len(table)


def test_a_glob_picks_runs_and_a_held_lock_reads_as_running(runs: Path, tmp_path: Path) -> None:
    hold = (  # the lock as a training process holds it (lockf, exclusive)
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
        "fcntl.lockf(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(runs / "lr-cut" / ".lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        table = compare.run_compare(runs, tmp_path, ["lr-c*", "lr-fast"], figure=False)
    finally:
        holder.communicate("")
    assert {r.name: r.status for r in table} == {"lr-cut": "running", "lr-fast": "finished"}
    assert compare.read_run(runs / "lr-cut").status == "stopped"  # released


def test_command_writes_the_figure_and_names_a_missing_run(
    runs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PROJECT_ROOT", str(runs.parent))
    monkeypatch.delenv("RUNS_DIR", raising=False)
    assert cli.main(["compare", "--name", "lr", "--metric", "loss"]) == 0
    out = capsys.readouterr().out
    assert "best loss (min) first" in out
    figure = runs.parent / "reports" / "figures" / "lr.png"
    assert figure.read_bytes().startswith(b"\x89PNG")
    assert cli.main(["compare", "nope-*"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: RUNS: no run matches 'nope-*'") and "\n" not in err
    assert cli.main(["compare", "--metric", "rmse"]) == 1
    assert "--metric 'rmse': not a validation metric" in capsys.readouterr().err


def test_the_printed_table_fits_100_columns_and_wide_prints_every_one(
    runs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PROJECT_ROOT", str(runs.parent))
    monkeypatch.delenv("RUNS_DIR", raising=False)
    assert cli.main(["compare", "--no-figure", "--name", "narrow"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[5] == "not shown: segments, wall h; every column: --wide, or reports/narrow.md"
    assert max(len(line) for line in lines[1:6]) <= compare.WIDTH
    header = [h.strip() for h in lines[1].split("  ") if h.strip()]
    assert header == [
        "run",
        "status",
        "…ps_this_segment",  # run.max_steps_this_segment: a long name keeps its end
        "train.lr",
        "accuracy best",  # the runs' run.best_metric
        "at step",
        "loss best",
        "steps",
        "GPU h",
    ]
    rows = {line.split()[0]: dict(zip(header, line.split(), strict=True)) for line in lines[2:5]}
    assert [rows[name]["steps"] for name in ("lr-fast", "lr-slow", "lr-cut")] == [
        "26/26",
        "26/26",
        "7/26",  # done/planned
    ]
    assert rows["lr-cut"]["status"] == "stopped"
    assert cli.main(["compare", "--no-figure", "--name", "narrow", "--wide"]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in wide) > compare.WIDTH
    markdown = (runs.parent / "reports" / "narrow.md").read_text().splitlines()[0]
    assert wide[1].split() == markdown.strip("| ").replace(" | ", "  ").split()
    assert "run.max_steps_this_segment" in wide[1] and "loss final" in wide[1]


def test_a_table_too_wide_cuts_long_settings_and_leaves_out_the_least_telling_columns() -> None:
    """Settings' names and values are cut to CELL characters; then segments, wall hours, the
    other metrics and the last settings are left out until the table fits; a run's name stays
    whole."""
    keys = [f"model.a_long_setting_name_{i}" for i in range(5)]
    runs = [
        compare.Run(
            name=name,
            status="finished",
            settings={
                "train.lr": lr,
                **{k: f'"{word}-{i}-{"x" * 30}"' for i, k in enumerate(keys)},
            },
            curves={"loss": [(10, 1.0), (20, loss)], "accuracy": [(20, 0.5)], "f1": [(20, 0.4)]},
            step=20,
            total_steps=40,
            segments=1,
            wall_h=0.5,
            gpu_h=1.0,
        )
        for name, lr, word, loss in (
            ("lr-0.1-with-warmup", "0.1", "one", 0.25),
            ("lr-0.01", "0.01", "two", 0.5),
        )
    ]
    runs = compare.score(runs, "loss", "min")
    header, rows, left_out = compare.short_table(runs, "loss")
    assert left_out == [
        "segments",
        "wall h",
        "f1 best",
        "accuracy best",
        "train.lr",
        "…_setting_name_4",
        "…_setting_name_3",
        "…_setting_name_2",
    ]
    assert header == [
        "run",
        "status",
        "…_setting_name_0",
        "…_setting_name_1",
        "loss best",
        "at step",
        "steps",
        "GPU h",
    ]
    assert rows[0][:4] == ["lr-0.1-with-warmup", "finished", '"one-0-xxxxxxxx…', '"one-1-xxxxxxxx…']
    assert rows[0][4:] == [0.25, 20, "20/40", 1.0]
    assert all(len(line) <= compare.WIDTH for line in compare.as_text(header, rows).splitlines())


def test_compare_leaves_a_committed_project_clean_for_submit(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reports/ is git-ignored: after compare, `make submit` and a run's provenance see no
    change (their check counts untracked files)."""
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    (tmp_path / "reports" / "figures").mkdir(parents=True)
    (tmp_path / "reports" / "figures" / ".gitkeep").touch()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-C", str(tmp_path)]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "start"]):
        subprocess.run([*git, *args], check=True)
    monkeypatch.setenv("PROJECT_ROOT", str(tmp_path))
    monkeypatch.setenv("RUNS_DIR", str(runs))
    assert cli.main(["compare", "--no-figure"]) == 0
    assert cli.main(["compare", "--no-figure", "--name", "sweep-4711"]) == 0
    assert (tmp_path / "reports" / "sweep-4711.md").is_file()
    assert pkg("observe.provenance").code_state(tmp_path)["dirty"] is False


def test_the_figure_writes_each_coloured_runs_best_value(
    runs: Path, tmp_path: Path, drawn: list[Any]
) -> None:
    table = compare.run_compare(runs, tmp_path, [], name="values")
    (axes,) = drawn[0].axes
    best = [(r.name, *r.best["accuracy"]) for r in table[: compare.HIGHLIGHT]]
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert legend == [
        f"{i}. {name}: {v:.4g} at step {step}" for i, (name, v, step) in enumerate(best, 1)
    ]
    # Each value written beside its marked point.
    assert [(t.get_text(), t.xy) for t in axes.texts] == [(f"{v:.4g}", (s, v)) for _, v, s in best]
    assert axes.get_title() == "validation accuracy: 3 runs"
    assert axes.get_legend().get_title().get_text() == "best accuracy"


DAMAGE = {
    "config.toml": lambda data: data[: len(data) // 2] + b"[run\n",  # cut off, then garbage
    "metrics.csv": lambda data: data.replace(b",val,", b",\xe9val,", 1),  # not UTF-8
    "summary.json": lambda data: data.replace(b'"wall_s": ', b'"wall_s": "x", "_": '),
}


@pytest.mark.parametrize("name", [*DAMAGE, "step"])
def test_a_damaged_run_is_a_row_of_its_own_and_the_others_print(
    runs: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
) -> None:
    copy = tmp_path / "runs"
    shutil.copytree(runs, copy)
    if name == "step":  # a step that is no number, in a train row
        path = copy / "lr-slow" / "metrics.csv"
        lines = path.read_text().splitlines(keepends=True)
        lines[1] = "x" + lines[1][lines[1].index(",") :]
        path.write_text("".join(lines))
    else:
        path = copy / "lr-slow" / name
        path.write_bytes(DAMAGE[name](path.read_bytes()))
    untouched = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    monkeypatch.setenv("PROJECT_ROOT", str(tmp_path))
    monkeypatch.delenv("RUNS_DIR", raising=False)
    assert cli.main(["compare", "--no-figure"]) == 1
    out, err = capsys.readouterr()
    assert err.startswith(f"warning: run lr-slow is damaged: {path}: ") and err.count("\n") == 1
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert rows.keys() >= {"lr-fast", "lr-slow", "lr-cut"} and "damaged" in rows["lr-slow"]
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == untouched


def test_a_report_compare_did_not_write_is_never_replaced(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(runs, tmp_path / "runs")
    monkeypatch.setenv("PROJECT_ROOT", str(tmp_path))
    monkeypatch.delenv("RUNS_DIR", raising=False)
    notes = tmp_path / "reports" / "thesis.md"
    notes.parent.mkdir()
    notes.write_text("# My thesis notes\n")
    capsys.readouterr()
    assert cli.main(["compare", "--no-figure", "--name", "thesis"]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"error: --name: {notes} exists and compare did not write it; "
        "give the report another --name\n"
    )
    assert notes.read_text() == "# My thesis notes\n"
    assert sorted(p.name for p in notes.parent.iterdir()) == ["thesis.md"]
    for _ in range(2):  # its own report it replaces, run after run
        assert cli.main(["compare", "--no-figure", "--name", "lr"]) == 0
    assert (notes.parent / "lr.csv").read_text().startswith("run,status,")


def test_compare_and_its_figure_need_no_torch(runs: Path) -> None:
    code = (
        f"import sys; from {PACKAGE} import cli; code = cli.main(['compare', '--name', 'light']); "
        "print(code, 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=cli_env(runs.parent),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.splitlines()[-1] == "0 False"  # a second on a login node
    assert (runs.parent / "reports" / "figures" / "light.png").is_file()


def test_packed_runs_share_the_gpu_memory_budget_cores_and_gpu_hours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *_a: (8 * 10**9, 80 * 10**9))
    assert runtime.fits_in_memory(3 * 10**9, 4.0, cuda)  # under half the free memory
    assert not runtime.fits_in_memory(3 * 10**9, 4.0, cuda, share=2)  # over a quarter
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda _: set(range(8)), raising=False)
    assert runtime.cpu_share(distributed.DistEnv(), {"PACKED_RUNS": "4", "SLURM_JOB_ID": "7"}) == 2
    job = {"SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "1", "SLURM_JOB_NUM_NODES": "1"}
    cpu = torch.device("cpu")
    assert runtime.billed_gpus(cpu, 1, job) == 1  # the allocation counts, used or not
    assert runtime.billed_gpus(cpu, 1, {**job, "PACKED_RUNS": "4"}) == 0.25
    assert (
        runtime.billed_gpus(cuda, 8, {**job, "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_NUM_NODES": "2"})
        == 8
    )
    assert runtime.billed_gpus(cuda, 2, {}) == 2  # no job: the GPUs trained on
    assert runtime.billed_gpus(cpu, 1, {}) == 0
    with pytest.raises(pkg("errors").ConfigError, match=r"PACKED_RUNS: must be a whole number"):
        runtime.packed_runs({"PACKED_RUNS": "two"})


def gpu_summary(runs_dir: Path, name: str, **values: float) -> None:
    """A summary.json as a run on a GPU writes it (this machine has none to train on)."""
    (runs_dir / name).mkdir(parents=True)
    summary = {"status": "finished", "samples_per_s": 1000.0, "peak_gpu_mem_gib": 2.0, **values}
    (runs_dir / name / "summary.json").write_text(json.dumps(summary))


def test_packing_advice_follows_utilisation_memory_and_measured_gain(tmp_path: Path) -> None:
    packing = pkg("ops.packing")
    assert packing.pack_size(20.0, 2.0, 80.0) == 5  # time: 100 / 20
    assert packing.pack_size(5.0, 30.0, 80.0) == 1  # memory: 30 GiB twice exceeds 80 % of 80 GB
    assert packing.pack_size(1.0, 0.1, 80.0) == packing.MOST
    runs = tmp_path / "runs"
    gpu_summary(runs, "busy", gpu_util_mean_pct=85.0)
    (busy,) = packing.advice(packing.trials(runs), 80.0)
    assert "85 % busy: one run per GPU" in busy
    gpu_summary(runs, "idle", gpu_util_mean_pct=24.0)  # the newest run counts
    (idle,) = packing.advice(packing.trials(runs), 80.0)
    assert "up to 4 runs per GPU (sbatch --export=ALL,PACK_SIZE=4 slurm/pack.sbatch)" in idle
    gpu_summary(runs, "pair", gpu_util_mean_pct=40.0, samples_per_s=800.0, packed_runs=2)
    _, gain = packing.advice(packing.trials(runs), 80.0)
    assert "2 packed runs (pair: 800 samples/s each) trained 1.60x" in gain


def test_doctor_says_when_packing_pays(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: doctor reads its memory, not the preset's")
    cfg = pkg("task").load_config(None, [])
    settings = pkg("settings").get_settings()
    pkg("ops.doctor").run_doctor(cfg, settings, quick=True)
    assert "packing  no run has trained on a GPU yet" in capsys.readouterr().out
    gpu_summary(settings.runs_dir, "trial", gpu_util_mean_pct=30.0)
    # As docs/pack-small-runs.md asks: the command line, after a run on a GPU.
    assert pkg("cli").main(["doctor", "--quick"]) == 0
    assert "packing  run trial kept the GPU 30 % busy" in capsys.readouterr().out
