"""Observation: what a run records and shows, never what it computes.

Metrics log, progress and timers (`metrics`), trackers (`tracking`: TensorBoard, W&B,
MLflow), figures (`plots`), crash and hang diagnostics (`diagnostics`) and provenance (git
commit, data digests, environment: `provenance`).

May import: `errors`, `settings`, `data`. Never: `engine`, `experiments`, `ops`, `tasks`.
"""
