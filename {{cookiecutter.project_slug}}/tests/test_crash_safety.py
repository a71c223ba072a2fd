"""kill -9 at random moments, also while a checkpoint is written, never corrupts the latest."""

import dataclasses
import multiprocessing
import random
import time
from pathlib import Path

from conftest import blobs, pkg

checkpoint = pkg("engine.state.checkpoint")
config = pkg("config")
trainer = pkg("engine.loop.trainer")


def newest_step(directory: Path) -> int:
    found = checkpoint.list_checkpoints(directory)
    return found[-1][0] if found else -1


def _train_forever(cfg) -> None:
    trainer.train(cfg, blobs("task.name=toy_tasks.blobs"))


def test_kill_9_never_leaves_an_unloadable_latest_checkpoint(project: Path) -> None:
    # A wide model and a checkpoint every step: most of the time goes into writing files.
    cfg = pkg("task").load_config(
        None,
        [
            "run.name=crash",
            "run.figures=false",
            "run.progress=log",
            "run.log_every_steps=1000",
            "run.checkpoint_every_steps=1",
            "model.hidden=1024",
            "train.batch_size=16",
            "train.epochs=50",
            "data.verify_raw=false",
            "task.name=toy_tasks.blobs",
        ],
    )
    ckpt_dir = project / "runs" / "crash" / "checkpoints"
    # The first segment runs here: it imports everything the trials then inherit by fork.
    trainer.train(
        dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, max_steps_this_segment=1)),
        blobs(),
    )
    fork = multiprocessing.get_context("fork")
    rng = random.Random(1)  # noqa: S311  (kill times, not secrets)
    steps, killed_while_writing = [], 0
    for _ in range(12):
        child = fork.Process(target=_train_forever, args=(cfg,))
        child.start()
        deadline = time.monotonic() + 30
        while newest_step(ckpt_dir) <= (steps[-1] if steps else -1):
            assert time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.005)  # until this process has written a checkpoint of its own
        time.sleep(rng.uniform(0.0, 0.3))
        child.kill()  # SIGKILL
        child.join()
        killed_while_writing += bool(list(ckpt_dir.glob(".step-*.tmp-*")))
        step, newest = checkpoint.list_checkpoints(ckpt_dir)[-1]
        state = checkpoint.load(newest)  # the newest file itself must load, no fallback
        assert state["position"]["step"] == step
        steps.append(step)
    assert steps == sorted(steps), steps
    assert steps[-1] > steps[0], steps  # the restarts resumed and made progress
    assert killed_while_writing >= 1, steps  # some kills landed in the middle of a write


def test_pruning_keeps_the_new_checkpoint_next_to_an_unloadable_later_one(tmp_path: Path) -> None:
    for step in (3, 5):
        checkpoint.save({"step": step}, tmp_path, step, keep=2)
    (tmp_path / "step-000000010.pt").write_bytes(b"cut off")  # a write that never completed
    # The resumed run (from step 5) saves step 7 with keep=1: step 7 stays, older ones go.
    assert checkpoint.load_latest(tmp_path) == {"step": 5}
    saved = checkpoint.save({"step": 7}, tmp_path, 7, keep=1)
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [7, 10]
    assert saved.is_file()
    assert checkpoint.load_latest(tmp_path) == {"step": 7}
