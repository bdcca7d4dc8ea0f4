"""The dashboard CSV (`results.csv`): one row per (entry, mode). Versioned: bump SCHEMA_VERSION on any
change to COLUMNS and say what changed in CHANGES, so nightly files of different ages can be read."""

from __future__ import annotations

SCHEMA_VERSION = 7
CHANGES = {
    1: "first version",
    2: "cause and control_error: a compile_fail/fail_to_run row's attribution by its control run "
       "(harness/sweep/control.py); empty in version-1 files, which read as version 2 with these columns empty",
    3: "numerics verdict columns: rel_rmse, reference, uninformative, nondeterministic, canary "
       "(empty in older files)",
    4: "drew: the random draws a forward made, served from the shared seeded CPU stream "
       "(harness/sweep/draws.py), function:count;... (empty in older files)",
    5: "ties: near-tied ranking selections in the baseline (harness/sweep/ties.py), compared up to tie order "
       "(empty in older files)",
    6: "phase (inference | train; files before version 6 read as inference), failed_at, optimizer, and performance "
       "columns warmup_steps, steady_compilations, recompiles, peak_rss_mb (empty in older files)",
    7: "warmup_s (warmup overhead) and wall_s (the row end to end), TorchTPU's per-model timings beside "
       "first_run_s and run_s (empty in older files)",
}
CAUSES = ("backend", "upstream")  # the control works | the control fails too

# Status words follow PyTorch's benchmarks/dynamo harness where it has one.
STATUSES = (
    "pass",  # ran and matched the baseline
    "fail_accuracy",  # ran, numbers differ from the baseline beyond tolerance
    "fail_to_run",  # an exception in eager mode (or at run time of a compiled graph)
    "compile_fail",  # torch.compile / XLA compilation raised
    "timeout",  # the per-entry time limit passed
    "oom",  # the per-worker memory cap was hit
    "crash",  # the worker process died (segfault, abort)
    "baseline_fail",  # the model does not run on the CPU baseline: not the backend's fault
    "not_available",  # the entry could not be built (not cached offline, missing dependency)
    "skipped",  # deselected, or the mode does not apply
)
# Statuses that count against the backend ("crash-free" denominators leave these out).
EXCLUDED_FROM_DENOMINATOR = ("baseline_fail", "not_available", "skipped")
RUN_FAILURES = ("fail_to_run", "compile_fail", "timeout", "oom", "crash")
# fused: eager with TORCH_TPU_DEFER_AND_FUSE (hf_tpu/fused.py); tp2: Transformers' tp_plan="auto" over 2 ranks
# (harness/sweep/tensor_parallel.py), opt-in with --tp 2. A new mode is a new value, not a new column: files of
# every schema version read as before.
MODES = ("eager", "fused", "compiled", "tp2")
# What a sweep runs unless --modes says otherwise (the nightly's). The others are opt-in: their expected
# results are compared only in runs that swept them (harness/ci/compare.py).
DEFAULT_MODES = ("eager", "compiled")
# inference: the entry's forward (no grad); train: N AdamW steps (harness/sweep/train.py). The nightly runs
# inference only until the full zoo is accepted with both.
PHASES = ("inference", "train")
DEFAULT_PHASES = ("inference",)

# (column, type, description)
COLUMNS: list[tuple[str, str, str]] = [
    ("entry_id", "str", "stable zoo id, e.g. transformers/llama/LlamaForCausalLM"),
    ("library", "str", "transformers | diffusers | hub | test"),
    ("model_type", "str", "config model_type (or diffusers family)"),
    ("model_class", "str", "model class name"),
    ("task", "str", "task family, e.g. causal-lm, image-classification, diffusion"),
    ("phase", "str", "inference | train (harness/sweep/train.py)"),
    ("mode", "str", "eager | fused | compiled | tp2 (tensor-parallel over 2 ranks)"),
    ("precision", "str", "float32 matmul precision on tpu: highest | high | medium"),
    ("dtype", "str", "model dtype: float32 | bfloat16"),
    ("status", "str", "one of STATUSES"),
    ("error_type", "str", "exception class name, empty on success"),
    ("error_message", "str", "first line of the error, normalised and truncated"),
    ("failing_op", "str", "ATen op named by the error (missing lowering), if any"),
    ("max_abs_err", "float", "max |tpu - baseline| over all output tensors"),
    ("max_rel_err", "float", "max |tpu - baseline| / max(|baseline|) per tensor, worst tensor"),
    ("cosine", "float", "lowest cosine similarity between tpu and baseline over output tensors"),
    ("rmse_ratio", "float", "rmse(fp64, tpu) / rmse(fp64, baseline), worst tensor (PyTorch same() rule)"),
    ("rel_rmse", "float", "rmse(fp64, tpu) / RMS(fp64), worst tensor: the error in units of the tensor's scale"),
    ("reference", "str", "float64 reference: valid | invalid: why (the row is judged without it) | none"),
    ("uninformative", "str", "why no baseline output carries information (zeros, constant, not finite, "
                             "unchanged when the input changes); '' when informative"),
    ("nondeterministic", "str", "two tpu runs of the same inputs differed: where and by how much; '' otherwise"),
    ("drew", "str", "random draws the baseline forward made (function:count;...), all served from one seeded CPU "
                    "stream in every run (harness/sweep/draws.py); '' when it drew nothing"),
    ("ties", "str", "ranking selections (topk/sort/argmax) whose baseline scores had near-ties, op(size):count;...; "
                    "outputs selected by them are compared up to tie order"),
    ("canary", "str", "--canary: caught | missed | untouched (fault, detail); '' when not run"),
    ("compile_s", "float", "seconds spent compiling (compiled mode: first call minus steady state)"),
    ("first_run_s", "float", "seconds for the first call"),
    ("run_s", "float", "steady-state seconds per call (train: per step), median of the calls after warmup"),
    ("warmup_s", "float", "warmup overhead: seconds of the warmup calls/steps beyond as many steady ones"),
    ("wall_s", "float", "seconds of the whole row: moving the model, every call/step, the comparison"),
    ("compilations", "int", "XLA programs compiled for this entry"),
    ("warmup_steps", "int", "calls (inference) or steps (train) until the compile count stopped changing, "
                            "at most 5; empty when the row was too slow to warm up"),
    ("steady_compilations", "int", "XLA programs compiled after warmup, in the timed steady calls/steps"),
    ("recompiles", "str", "'recompiles' when steady_compilations > 0 (TorchTPU's PostWarmupRecompileError)"),
    ("peak_rss_mb", "float", "peak resident memory of the worker during the row, MiB (VmHWM, reset per row)"),
    ("failed_at", "str", "train rows that raised: 'step K forward | backward | optimizer'"),
    ("optimizer", "str", "train rows: the tpu optimizer, 'AdamW fused' or 'AdamW foreach (why not fused)'"),
    ("graph_breaks", "int", "Dynamo graph breaks"),
    ("fallback_ops", "str", "ops that ran on the CPU fallback, op:count;..."),
    ("located_module", "str", "diagnose: first module whose output diverges or raises"),
    ("located_op", "str", "diagnose: first ATen op whose result differs or raises"),
    ("repro_path", "str", "diagnose: standalone repro script"),
    ("cause", "str", "compile_fail/fail_to_run rows: backend (the control works) | upstream (it fails too); "
                     "control = aot_eager on CPU (compiled), the CPU baseline (eager); compiled fail_accuracy "
                     "rows: the same control judged by the numerics rule; empty otherwise"),
    ("control_error", "str", "upstream rows: how the control failed, 'Type: message' (accuracy: 'aot_eager on "
                             "CPU fails the rule too: ...')"),
    ("backend", "str", "which backend served tpu, e.g. hf_tpu-jax-cpu or torch_tpu"),
    ("versions", "str", "package versions: torch=..;jax=..;transformers=..;diffusers=.."),
    ("timestamp", "str", "UTC ISO-8601 time the row was written"),
    ("schema_version", "int", "SCHEMA_VERSION of this row"),
]
COLUMN_NAMES = [c for c, _, _ in COLUMNS]
KEY = ("entry_id", "phase", "mode")
# Performance figures are measurements, not results: they differ run to run (load, cache state, allocator) and
# never make two rows of the same (entry, phase, mode) disagree (merge, tests) nor a regression (compare).
MEASUREMENTS = ("compile_s", "first_run_s", "run_s", "warmup_s", "wall_s", "compilations", "warmup_steps",
                "steady_compilations", "recompiles", "peak_rss_mb")
# Columns that may differ between two runs with the same results: the measurements and when the row was written.
VOLATILE = ("timestamp", *MEASUREMENTS)
# Columns added after version 1, with the version that added them: a file of an older version lacks them and
# reads with them empty (readers: harness.sweep.results.read_csv, harness.ci.runs.read_results_csv).
ADDED_IN: dict[str, int] = {"cause": 2, "control_error": 2, "rel_rmse": 3, "reference": 3, "uninformative": 3,
                            "nondeterministic": 3, "canary": 3,
                            "drew": 4, "ties": 5, "phase": 6, "warmup_steps": 6, "steady_compilations": 6,
                            "recompiles": 6, "peak_rss_mb": 6, "failed_at": 6, "optimizer": 6,
                            "warmup_s": 7, "wall_s": 7}


def absent_in(version: int) -> list[str]:
    """Columns a file of schema `version` does not have (added later); raises ValueError for a version this
    hf-tpu does not know (newer than SCHEMA_VERSION, or not a version at all)."""
    if version not in CHANGES:
        raise ValueError(f"schema_version {version} is unknown to this hf-tpu (it reads 1..{SCHEMA_VERSION})")
    return [c for c, v in ADDED_IN.items() if v > version]

