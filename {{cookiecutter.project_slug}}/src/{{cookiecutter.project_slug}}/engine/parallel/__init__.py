"""The parallel layer: processes, devices, and how a model is placed and sharded on them.

Owns: distributed (process group, collectives), strategy (ddp, fsdp), runtime, preemption.
May import: the seam, the engine's helpers, state (to read weights into a model). Never: loop.
"""
