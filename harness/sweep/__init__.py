"""The sweep: every selected zoo entry on `tpu`, eager and compiled, against a CPU baseline (issue 5).

Modules, one job each: options (the option record), entries (load, select, shard), testzoo (the harness's own
misbehaving entries), device (the device under test), runner (one entry's runs, in a worker), numerics
(tolerances and the comparison rule), errors (exceptions to row columns), worker (reusable isolated worker
processes), executors (local pool, Ray), results (atomic per-entry rows, the CSV), outputs (coverage.md,
crashes.md, numerics.md), progress, sweep (the driver), cli and merge_cli (the commands)."""
