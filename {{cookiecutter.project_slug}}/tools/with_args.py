"""Run a command with the words of ARGS after it: how `make train ARGS="..."` and the like run.

make hands a recipe the value of ARGS as text, in the environment. Split by the shell
(`$ARGS` unquoted), the quotes of ARGS="'lr-*' --metric accuracy" would stay in the words and
an unquoted `lr-*` would match files in the project root; evaluated by the shell (`eval`),
`$(...)` and backticks in the value would run. Here the value is split into words as a shell
splits them, quotes and backslashes honoured (shlex), and nothing in it is expanded, matched
or run. The command line is printed first, quoted so that it can be pasted, as make prints
a recipe; then the command replaces this process, so its exit status and signals are its own.

Standard library only: it runs before `make install` too (make submit on a login node).
"""

from __future__ import annotations

import os
import shlex
import sys


def main(command: list[str]) -> int:
    """Run `command` with the words of $ARGS appended; 2 for ARGS that cannot be split."""
    value = os.environ.get("ARGS", "")
    try:
        words = shlex.split(value)
    except ValueError as err:  # an unclosed quote, a backslash at the end
        print(f"error: ARGS: {str(err).lower()} in {value}", file=sys.stderr)
        return 2
    full = [*command, *words]
    print(shlex.join(full), flush=True)
    try:
        os.execvp(full[0], full)  # noqa: S606  (the recipe's command, no shell: nothing expanded)
    except OSError as err:  # not there (no `make install` yet), not executable
        print(f"error: {full[0]}: {err.strerror}", file=sys.stderr)
        return 127  # the shell's status for a command it cannot run


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: with_args.py COMMAND [ARG ...]  (the words of $ARGS follow them)")
    sys.exit(main(sys.argv[1:]))
