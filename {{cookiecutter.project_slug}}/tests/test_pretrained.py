"""`model.init_from` in every layout a model is shipped in, and `export` of a run's weights."""

import json
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import PACKAGE, CliHere, assert_identical, blobs, cli_env, final_weights, pkg

trainer, checkpoint, pretrained = (
    pkg("engine.loop.trainer"),
    pkg("engine.state.checkpoint"),
    pkg("data.pretrained"),
)
config = pkg("config")
errors = pkg("errors")
FAST = ["run.progress=log", "run.figures=false", "data.verify_raw=false", "model.hidden=16"]


def donor(project: Path) -> dict[str, torch.Tensor]:
    """Weights of the right shapes for the blobs model, unlike any fresh initialisation."""
    model = blobs(*FAST).build_model()
    return {
        k: torch.full_like(v, 0.25) + 0.01 * i
        for i, (k, v) in enumerate(model.state_dict().items())
    }


def write_sharded(weights: dict[str, torch.Tensor], folder: Path) -> None:
    """Two shard files and their index, as a model hub download has them."""
    folder.mkdir()
    keys = sorted(weights)
    halves = {
        "model-00001-of-00002.safetensors": keys[::2],
        "model-00002-of-00002.safetensors": keys[1::2],
    }
    for name, part in halves.items():
        save_file({k: weights[k].contiguous() for k in part}, folder / name)
    weight_map = {k: name for name, part in halves.items() for k in part}
    (folder / pretrained.INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def write_layout(layout: str, weights: dict[str, torch.Tensor], project: Path) -> Path:
    if layout == "safetensors":
        save_file(weights, project / "base.safetensors")
        return project / "base.safetensors"
    if layout == "sharded":
        write_sharded(weights, project / "base")
        return project / "base"
    if layout == "single-folder":
        (project / "base").mkdir()
        save_file(weights, project / "base" / pretrained.SINGLE)
        return project / "base"
    torch.save({"model": weights, "step": 3}, project / "base.pt")  # another run's checkpoint
    return project / "base.pt"


@pytest.mark.parametrize("layout", ["safetensors", "sharded", "single-folder", "checkpoint"])
def test_init_from_reads_each_layout_into_the_model(project: Path, layout: str) -> None:
    weights = donor(project)
    path = write_layout(layout, weights, project)
    assert pretrained.read_weights(path).keys() == weights.keys()
    # The first layer stays frozen through the one epoch: it must end as it was loaded.
    task = blobs(
        *FAST, "run.name=tuned", "train.epochs=1", f"model.init_from={path.name}", freeze_epochs=1
    )
    trainer.train(task.cfg, task)
    final = final_weights(project / "runs" / "tuned")
    assert torch.equal(final["1.weight"], weights["1.weight"])
    assert not torch.equal(final["4.weight"], weights["4.weight"])  # the rest trained


def bad_layouts(project: Path, weights: dict[str, torch.Tensor]) -> dict[str, tuple[Path, str]]:
    """Damaged inputs and the message each must produce."""
    write_sharded(weights, project / "gone")
    (project / "gone" / "model-00002-of-00002.safetensors").unlink()
    write_sharded(weights, project / "moved")
    first = project / "moved" / "model-00001-of-00002.safetensors"
    save_file({"other": torch.zeros(1)}, first)
    (project / "noindex").mkdir()
    (project / "badindex").mkdir()
    (project / "badindex" / pretrained.INDEX).write_text("{not json")
    (project / "junk.safetensors").write_bytes(b"\x00" * 64)
    (project / "junk.pt").write_text("not a weights file")
    return {
        "missing": (project / "nothing.safetensors", "model.init_from: no file"),
        "shard": (project / "gone", "shard model-00002-of-00002.safetensors named in"),
        "moved": (project / "moved", "lacks "),
        "folder": (project / "noindex", f"has neither {pretrained.INDEX}"),
        "index": (project / "badindex", "has no valid weight_map"),
        "junk": (project / "junk.safetensors", "is not a safetensors file"),
        "pickle": (project / "junk.pt", "is not a safetensors or PyTorch weights file"),
    }


def test_unreadable_weights_get_one_line_naming_the_path(project: Path) -> None:
    for name, (path, message) in bad_layouts(project, donor(project)).items():
        with pytest.raises(errors.ConfigError) as caught:
            pretrained.read_weights(path, pretrained.FIELD)
        text = str(caught.value)
        assert message in text and "\n" not in text, name
        assert str(path.name) in text, name


def refusal(read: Callable[[], object]) -> str:
    """The one line `read` is refused with."""
    with pytest.raises(errors.ConfigError) as caught:
        read()
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_task_options_missing_weights_are_named_by_that_option(project: Path) -> None:
    """Task code hands `read_weights` a path alone: the line names the option that held it."""
    task = blobs(*FAST, weights="models/teacher.safetensors")
    assert refusal(task.build_model) == "task.weights: no file models/teacher.safetensors"
    # The task joined the option to a folder: the same option. No setting holds a path: none.
    joined = project / "models" / "teacher.safetensors"
    assert refusal(lambda: pretrained.read_weights(joined)) == f"task.weights: no file {joined}"
    other = project / "other.pt"
    assert refusal(lambda: pretrained.read_weights(other)) == f"no weights file {other}"
    # A damaged file is named by the option too, as model.init_from names its own.
    (project / "junk.pt").write_text("not a weights file")
    junk = blobs(*FAST, weights=str(project / "junk.pt"))
    line = refusal(junk.build_model)
    assert line.startswith(f"task.weights: {project / 'junk.pt'} is not a safetensors"), line


def test_a_shape_mismatch_names_the_key(project: Path) -> None:
    weights = donor(project)
    weights["7.weight"] = torch.zeros(3, 3)
    save_file(weights, project / "wrong.safetensors")
    task = blobs(*FAST, "run.name=wrong", "model.init_from=wrong.safetensors")
    with pytest.raises(errors.CheckpointError, match=r"shape 7\.weight \[3, 3\] vs \[4, 16\]"):
        trainer.train(task.cfg, task)


# --- export ------------------------------------------------------------------------------
def test_export_writes_final_and_best_weights_with_the_config(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = blobs(*FAST, "run.name=done", "train.epochs=2", "run.best_metric=loss")
    trainer.train(task.cfg, task)
    run_dir = project / "runs" / "done"
    final = final_weights(run_dir)

    capsys.readouterr()
    assert pkg("cli").main(["export", "--run", "done"]) == 0
    folder = run_dir / "export"
    assert f"wrote {folder}: model, final weights, fp32" in capsys.readouterr().out
    written = load_file(folder / "model.safetensors")
    assert_identical(written, final)
    saved = pkg("task").load_config(folder / "config.toml")
    assert config.to_dict(saved) == config.to_dict(task.cfg)
    # The export is a model folder that model.init_from reads.
    assert_identical(pretrained.read_weights(folder), final)

    # The best weights in bf16, by the command line docs/fine-tune-lm.md shows.
    half = project / "half"
    argv = ["export", "--run", "done", "--weights", "best", "--dtype", "bf16", "--out", str(half)]
    assert pkg("cli").main(argv) == 0
    assert f"wrote {half}: model, best weights, bf16" in capsys.readouterr().out
    best = checkpoint.load(run_dir / "best.pt")["model"]
    written = load_file(half / "model.safetensors")
    assert {t.dtype for t in written.values()} == {torch.bfloat16}
    assert_identical(written, {k: v.to(torch.bfloat16) for k, v in best.items()})
    assert sorted(p.name for p in project.iterdir() if p.name.startswith(".")) == []


def test_export_replaces_only_its_own_folder(project: Path, cli_here: CliHere) -> None:
    """An existing path that is not an earlier export of the run is refused, untouched."""
    export, settings = pkg("ops.export"), pkg("settings").get_settings()
    task = blobs(*FAST, "run.name=mine", "train.epochs=1")
    trainer.train(task.cfg, task)
    run_dir = project / "runs" / "mine"
    (project / "README.md").write_text("my notes\n", encoding="utf-8")
    (project / "data" / "raw").mkdir(parents=True, exist_ok=True)
    (project / "data" / "raw" / "keep.csv").write_text("1,2\n", encoding="utf-8")
    (project / "elsewhere").symlink_to(project / "data")
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
    for out in ["runs/mine", "data", "README.md", ".", "elsewhere", "runs"]:
        with pytest.raises(pkg("errors").ConfigError, match="is not an earlier export of run mine"):
            export.export_run(run_dir, project / out, settings)
    assert {p: p.read_bytes() for p in project.rglob("*") if p.is_file()} == before
    done = cli_here("export", "--run", "mine", "--out", str(project / "data"))
    assert (done.returncode, done.stderr.count("\n")) == (2, 1), done.stderr
    assert f"--out {project / 'data'}: exists" in done.stderr

    first = export.export_run(run_dir, project / "exported", settings)
    again = export.export_run(run_dir, first, settings, dtype="bf16")  # its own: replaced
    assert json.loads((again / "export.json").read_text())["dtype"] == "bf16"
    other = blobs(*FAST, "run.name=other", "train.epochs=1")
    trainer.train(other.cfg, other)
    with pytest.raises(pkg("errors").ConfigError, match="not an earlier export of run other"):
        export.export_run(project / "runs" / "other", first, settings)


def test_a_second_export_keeps_what_the_user_added(project: Path) -> None:
    export, settings = pkg("ops.export"), pkg("settings").get_settings()
    task = blobs(*FAST, "run.name=kept", "train.epochs=1")
    trainer.train(task.cfg, task)
    run_dir = project / "runs" / "kept"
    out = export.export_run(run_dir, run_dir / "export", settings)
    written = json.loads((out / "export.json").read_text())["files"]
    assert sorted(p.name for p in out.iterdir()) == written
    (out / "notes.md").write_text("evaluated on the new set\n")
    (out / "eval").mkdir()
    (out / "eval" / "scores.json").write_text("{}\n")
    export.export_run(run_dir, out, settings, dtype="bf16")
    assert (out / "notes.md").read_text() == "evaluated on the new set\n"
    assert (out / "eval" / "scores.json").read_text() == "{}\n"
    assert json.loads((out / "export.json").read_text())["dtype"] == "bf16"
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.bfloat16}
    # A file of the user's that export would now write: refused, nothing changed.
    (out / "config.toml").unlink()
    record = json.loads((out / "export.json").read_text())
    record["files"].remove("config.toml")
    (out / "export.json").write_text(json.dumps(record))
    (out / "config.toml").write_text("mine\n")
    with pytest.raises(pkg("errors").ConfigError, match=r"config\.toml is yours"):
        export.export_run(run_dir, out, settings)
    assert (out / "config.toml").read_text() == "mine\n"


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_exported_files_follow_the_umask(project: Path, umask: int) -> None:
    """Shards, index, hub files, config and record: the group reads what the umask lets it.

    safetensors writes 0600 and a hub folder's tokenizer file (0600 here) would keep its mode.
    """
    export, settings = pkg("ops.export"), pkg("settings").get_settings()
    base = write_layout("single-folder", donor(project), project)
    (base / "config.json").write_text('{"model_type": "toy"}\n')
    (base / "tokenizer.json").write_text("{}\n")
    (base / "tokenizer.json").chmod(0o600)
    task = blobs(*FAST, "run.name=shared", "train.epochs=1", f"model.init_from={base.name}")
    trainer.train(task.cfg, task)
    before = os.umask(umask)
    try:
        out = export.export_run(
            project / "runs" / "shared", project / "exported", settings, shard_gb=1e-6
        )
    finally:
        os.umask(before)
    written = sorted(p.name for p in out.iterdir())
    assert {pretrained.INDEX, "config.json", "tokenizer.json", "config.toml"} <= set(written)
    assert sum(name.endswith(".safetensors") for name in written) > 1  # shards
    modes = {name: oct(stat.S_IMODE((out / name).stat().st_mode)) for name in written}
    assert modes == dict.fromkeys(written, oct(0o666 & ~umask))
    assert oct(stat.S_IMODE(out.stat().st_mode)) == oct(0o777 & ~umask)


def test_leftovers_of_a_killed_export_go_and_a_running_ones_stay(project: Path) -> None:
    export, settings = pkg("ops.export"), pkg("settings").get_settings()
    task = blobs(*FAST, "run.name=left", "train.epochs=1")
    trainer.train(task.cfg, task)
    run_dir = project / "runs" / "left"
    host = socket.gethostname()
    killed = subprocess.Popen(["sleep", "60"])
    killed.kill()
    killed.wait()
    running = subprocess.Popen(["sleep", "60"])
    try:
        gone = run_dir / f".export.tmp-{host}-{killed.pid}"
        alive = run_dir / f".export.tmp-{host}-{running.pid}"
        for folder in (gone, alive):
            folder.mkdir()
            (folder / "model.safetensors").write_bytes(b"half")
        export.export_run(run_dir, run_dir / "export", settings)
        assert not gone.exists()
        assert (alive / "model.safetensors").read_bytes() == b"half"
    finally:
        running.kill()
        running.wait()


def test_a_full_disk_during_export_is_one_line_and_leaves_nothing(project: Path) -> None:
    """A file-size limit makes the weights' write fail as a full disk does (in safetensors)."""
    task = blobs(*FAST, "run.name=full", "train.epochs=1", "model.hidden=256")
    trainer.train(task.cfg, task)

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    done = subprocess.run(
        [sys.executable, "-m", PACKAGE, "export", "--run", "full"],
        cwd=project,
        env=cli_env(project),
        capture_output=True,
        text=True,
        preexec_fn=small_files,
        check=False,
        timeout=300,
    )
    assert (done.returncode, done.stderr.count("\n")) == (2, 1), done.stderr
    assert f"writing into {project / 'runs' / 'full'} failed (" in done.stderr
    assert "GB free there" in done.stderr
    assert sorted(p.name for p in (project / "runs" / "full").iterdir() if "export" in p.name) == []


def test_export_without_weights_gets_one_line(project: Path, cli_here: CliHere) -> None:
    task = blobs(*FAST, "run.name=plain", "train.epochs=1")
    trainer.train(task.cfg, task)
    out = cli_here("export", "--run", "plain", "--weights", "best")
    assert (out.returncode, out.stderr.count("\n")) == (1, 1), out.stderr
    assert "best.pt: the run kept no best weights (run.best_metric)" in out.stderr
    out = cli_here("export", "--run", "nothing")
    assert (out.returncode, out.stderr.count("\n")) == (1, 1), out.stderr
    assert "no intact checkpoint in" in out.stderr
    assert not (project / "runs" / "plain" / "export").exists()
