"""Listeners of a training run: told each validation and the final summary, on rank 0.

A sweep's Optuna trial is one (sweep.py): it reports the validation metric and may ask to
stop a run that is not promising. The trainer knows only this interface, so it imports no
sweep library and a run without listeners behaves exactly as before.
"""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol


class Listener(Protocol):
    """What the trainer tells a listener (on rank 0 only)."""

    def validated(self, step: int, metrics: Mapping[str, float]) -> bool:
        """After a validation at optimizer step `step`; True asks the run to stop (pruned)."""

    def ended(self, summary: Mapping[str, Any]) -> None:
        """The run's summary.json content, once per segment (status finished, pruned, ...)."""


_LISTENERS: list[Listener] = []


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Register `listener` for the runs started inside the block."""
    _LISTENERS.append(listener)
    try:
        yield
    finally:
        _LISTENERS.remove(listener)


def validated(step: int, metrics: Mapping[str, float]) -> bool:
    """Tell every listener (each hears it); True when any of them asks to stop."""
    answers = [listener.validated(step, metrics) for listener in _LISTENERS]
    return any(answers)


def ended(summary: Mapping[str, Any]) -> None:
    """Tell every listener the run's summary."""
    for listener in _LISTENERS:
        listener.ended(summary)
