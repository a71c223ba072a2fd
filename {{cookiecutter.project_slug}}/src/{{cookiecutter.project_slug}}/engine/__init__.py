"""The engine: the training loop and everything it drives, unaware of any research problem.

Holds the loop (`trainer`) and its train rows' means (`train_scalars`), what the data makes
of a run (`sizes`: batch path, steps), batches and their placement (`batches`, a stream's in
`stream_batches`, both loaded with the settings of `loading` and moved to the device by
`transfer`), the random states (`rng`), evaluation, the parallelism strategies (`strategy`:
ddp, fsdp), checkpoints and their I/O (`checkpoint`, `checkpoint_io`, `shard_files`,
`run_weights`), optimizer defaults, the runtime (device, precision, workers), distributed
set-up, stop signals and hooks.

May import: the seam (`task`, `config`, `errors`, `settings`), `data`, `observe`.
Never: `tasks`, `experiments`, `ops` (they build on the engine, not the other way round).
"""
