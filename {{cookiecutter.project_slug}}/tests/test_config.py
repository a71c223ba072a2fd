"""Configuration: the shipped TOML, overrides, type checks and one-line errors."""

import dataclasses
import re
from pathlib import Path

import pytest

from conftest import ROOT, pkg

config = pkg("config")
ConfigError = pkg("errors").ConfigError
TRAIN_TOML = ROOT / "configs" / "train.toml"


def test_shipped_config_loads_and_sets_every_section() -> None:
    cfg = pkg("task").load_config(TRAIN_TOML)
    assert cfg.run.tracking in config.CHOICES["run.tracking"]
    assert cfg.task.name in pkg("task").available()
    assert cfg.train.epochs > 0


def test_overrides_are_typed() -> None:
    cfg = pkg("task").load_config(
        TRAIN_TOML,
        [
            "train.epochs=3",
            "train.lr=1e-4",
            "run.deterministic=yes",
            "run.name=abc",
            "dist.timeout_minutes=2",
        ],
    )
    assert cfg.train.epochs == 3
    assert cfg.train.lr == pytest.approx(1e-4)
    assert cfg.run.deterministic is True
    assert cfg.run.name == "abc"
    assert cfg.dist.timeout_minutes == 2.0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.epoch=3", "unknown config key 'train.epoch'"),
        ("trian.epochs=3", "unknown config key 'trian.epochs'"),  # codespell:ignore trian
        ("epochs=3", "unknown config key 'epochs'"),
        ("train.epochs=three", "train.epochs: expected int, got 'three'"),
        ("train.epochs=0", "train.epochs: must be > 0"),
        ("run.deterministic=maybe", "run.deterministic: expected bool"),
        ("train.precision=fp8", "train.precision: must be one of"),
        ("train.lr=nan", "train.lr: must be a finite number"),
        ("train.epochs", "expected section.key=value"),
    ],
)
def test_bad_overrides_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        pkg("task").load_config(None, [override])
    assert "\n" not in str(err.value)


def test_toml_types_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[train]\nepochs = "ten"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"train\.epochs: expected int, got str"):
        pkg("task").load_config(path)
    path.write_text("[train]\nlr = 1\n", encoding="utf-8")  # an int where a float is expected
    assert pkg("task").load_config(path).train.lr == 1.0
    path.write_text("[train\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"invalid TOML"):
        pkg("task").load_config(path)


def test_resolved_config_round_trips_through_toml(tmp_path: Path) -> None:
    cfg = pkg("task").load_config(TRAIN_TOML, ['run.name=quote"and\\back', "train.lr=1e-05"])
    path = tmp_path / "resolved.toml"
    path.write_text(config.to_toml(cfg), encoding="utf-8")
    again = pkg("task").load_config(path)
    assert dataclasses.asdict(again) == dataclasses.asdict(cfg)
    assert pkg("task").config_from_dict(config.to_dict(cfg)) == cfg


def test_cli_reports_a_bad_key_in_one_line_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = pkg("cli").main(["train", "train.bogus=1"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: unknown config key 'train.bogus'")
    assert err.count("\n") == 1


def test_cli_reports_a_missing_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert pkg("cli").main(["train", "--config", "no/such/file.toml"]) == 2
    assert "config file not found: no/such/file.toml" in capsys.readouterr().err


def test_the_old_dataset_key_says_what_replaced_it(tmp_path) -> None:
    old = tmp_path / "train.toml"
    old.write_text('[data]\ndataset = "digits"\n')
    with pytest.raises(ConfigError, match=r"data.dataset = 'digits': replaced by the task seam"):
        pkg("task").load_config(old)
