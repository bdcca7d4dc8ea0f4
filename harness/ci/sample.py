"""Crafted results rows and runs with every schema column, for tests and for previewing the dashboard
(`python -m harness.ci.sample DIR` writes a small demo run)."""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterable
from pathlib import Path

from harness import schema

_DEFAULTS: dict[str, object] = {
    "library": "transformers",
    "model_type": "",
    "model_class": "",
    "task": "causal-lm",
    "phase": "inference",
    "mode": "eager",
    "precision": "highest",
    "dtype": "float32",
    "status": "pass",
    "backend": "hf_tpu-jax-cpu",
    "versions": "torch=2.13.0",
    "timestamp": "2026-01-01T00:00:00Z",
    "schema_version": schema.SCHEMA_VERSION,
}


def row(entry_id: str, **fields: object) -> dict[str, object]:
    """A full schema row: defaults for everything not given; unknown field names are an error."""
    unknown = set(fields) - set(schema.COLUMN_NAMES)
    if unknown:
        raise KeyError(f"not schema columns: {sorted(unknown)}")
    r: dict[str, object] = {c: "" for c in schema.COLUMN_NAMES}
    r.update(_DEFAULTS)
    r["entry_id"] = entry_id
    r["model_class"] = entry_id.rsplit("/", 1)[-1]
    if fields.get("status", "pass") in ("pass", "fail_accuracy"):
        r.update(max_abs_err=1e-6, max_rel_err=1e-6, cosine=1.0, rmse_ratio=1.0)
    r.update(fields)
    return r


def write_run(run_dir: str | Path, rows: Iterable[dict[str, object]]) -> Path:
    """Write rows as RUN/results.csv with the schema's column order; returns the run directory."""
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=schema.COLUMN_NAMES, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    return d


def demo_rows(timestamp: str = "2026-01-02T03:00:00Z") -> list[dict[str, object]]:
    """A small run touching every status, two modes, several tasks and libraries."""
    t = timestamp
    rows = []
    for mode in ("eager", "compiled"):  # the nightly's default modes
        rows += [
            row("transformers/bert/BertModel", task="feature-extraction", mode=mode, timestamp=t),
            row("transformers/llama/LlamaForCausalLM", task="causal-lm", mode=mode, timestamp=t, run_s=0.12),
            row("transformers/gpt2/GPT2LMHeadModel", task="causal-lm", mode=mode, timestamp=t),
            row("transformers/vit/ViTForImageClassification", task="image-classification", mode=mode, timestamp=t,
                status="fail_accuracy", max_abs_err=0.31, max_rel_err=0.05, cosine=0.9987, rmse_ratio=7.5),
            row("transformers/t5/T5ForConditionalGeneration", task="seq2seq-lm", mode=mode, timestamp=t,
                status="fail_to_run", error_type="NotImplementedError",
                error_message="no lowering for aten::_weight_int4pack_mm at 0x7f3a2c (shape [2, 128])",
                failing_op="aten::_weight_int4pack_mm"),
            row("diffusers/unet/UNet2DModel", library="diffusers", task="diffusion", mode=mode, timestamp=t,
                max_abs_err=2e-5, rmse_ratio=1.4, cosine=0.99999),
            row("hub/sentence-transformers/all-MiniLM", library="hub", task="feature-extraction", mode=mode,
                timestamp=t, status="not_available", error_message="not in the offline cache"),
            row("transformers/whisper/WhisperModel", task="speech", mode=mode, timestamp=t, status="baseline_fail",
                error_type="RuntimeError", error_message="baseline failed"),
        ]
    rows += [
        row("transformers/mixtral/MixtralForCausalLM", task="causal-lm", mode="compiled", timestamp=t,
            status="compile_fail", error_type="NotImplementedError",
            error_message="no lowering for aten::_weight_int4pack_mm at 0x55aa10 (shape [4, 64])",
            failing_op="aten::_weight_int4pack_mm", graph_breaks=3),
        row("transformers/mixtral/MixtralForCausalLM", task="causal-lm", mode="eager", timestamp=t),
        row("diffusers/vae/AutoencoderKL", library="diffusers", task="diffusion", mode="eager", timestamp=t,
            status="crash", error_type="SIGSEGV", error_message="worker died with signal 11"),
        row("diffusers/vae/AutoencoderKL", library="diffusers", task="diffusion", mode="compiled", timestamp=t,
            status="timeout", error_type="Timeout", error_message="exceeded 300 s"),
        row("test/oom/Big", library="test", task="test", mode="eager", timestamp=t, status="oom",
            error_type="MemoryError", error_message="worker exceeded 4096 MB"),
        row("test/oom/Big", library="test", task="test", mode="compiled", timestamp=t, status="skipped"),
    ]
    return rows


if __name__ == "__main__":
    out = write_run(sys.argv[1] if len(sys.argv) > 1 else "reports/demo", demo_rows())
    print(out / "results.csv")
