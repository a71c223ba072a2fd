"""The engine: the training loop and everything it drives, unaware of any research problem.

Three wings and three helpers. `loop/`: the order of a run's events (the trainer, the update
rule, batches, evaluation). `state/`: the state on disk (checkpoints and their format, a run's
weights, initial weights). `parallel/`: processes and devices (the process group, the ddp and
fsdp strategies, runtime, stop signals). Helpers any wing may use: optimizer defaults
(`optim`), run names (`names`), the user's hooks (`hooks`); they import no wing.

May import: the seam (`task`, `config`, `errors`, `settings`), `data`, `observe`.
Never: `tasks`, `experiments`, `ops` (they build on the engine, not the other way round).
"""
