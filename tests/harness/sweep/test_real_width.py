"""A Hub model at its real widths, capped to 2 layers the way the harness reads Hub lists, runs eager on
tpu inside the sweep's default per-worker memory cap (it ended `oom` when views were host index arrays)."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"
QWEN3_06B = {  # Qwen/Qwen3-0.6B's config.json, as published
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000, "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
}


@pytest.mark.slow
def test_real_width_hub_model_runs_eager_under_the_default_memory_cap(tmp_path):
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-0.6B" / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(QWEN3_06B))
    (tmp_path / "hub" / "models--Qwen--Qwen3-0.6B" / "refs").mkdir()
    (tmp_path / "hub" / "models--Qwen--Qwen3-0.6B" / "refs" / "main").write_text(COMMIT)
    models = tmp_path / "models.csv"
    models.write_text("model_id,model_type,pipeline_tag\nQwen/Qwen3-0.6B,qwen3,text-generation\n")
    out = tmp_path / "out"
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "harness", "sweep", "--zoo", str(models), "--modes", "eager",
                    "--jobs", "1", "--out", str(out), "--progress", "none"], env=env, check=True, timeout=900)
    rows = pd.read_csv(out / "results.csv")
    eager = rows[rows["mode"] == "eager"].iloc[0]
    assert eager["status"] == "pass", (eager["status"], eager.get("error_message"))
