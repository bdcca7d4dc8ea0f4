"""`torchrun --nproc_per_node=2` with backend="tpu_dist", each rank on its own tpu:LOCAL_RANK (torchrun's
LOCAL_WORLD_SIZE gives each process one tpu device per local rank, hf_tpu/devices.py), against the same
script on CPU with gloo (distributed_child.py)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def _torchrun(kind: str, what: str, *extra: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_NUM_DEVICES", "TORCH_TPU_DEVICES_PER_HOST")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           f"--master_port={random.randint(20000, 40000)}", str(HERE / "distributed_child.py"), kind, what, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    # the two ranks share torchrun's stdout, so their lines may run together: decode from each marker
    decoder = json.JSONDecoder()
    rows = [decoder.raw_decode(part)[0] for part in r.stdout.split("RESULT ")[1:]]
    assert r.returncode == 0 and len(rows) == 2, f"{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return sorted(rows, key=lambda row: row["rank"])


@pytest.mark.slow
def test_collectives_on_tpu_tensors_match_gloo_on_cpu() -> None:
    cpu, tpu = _torchrun("cpu", "collectives"), _torchrun("tpu", "collectives")
    for rank, (c, t) in enumerate(zip(cpu, tpu, strict=True)):
        for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
                     "all_to_all_single", "all_to_all", "funcol_all_gather", "funcol_reduce_scatter",
                     "funcol_all_reduce"):
            assert t[name][0] == f"tpu:{rank}", (name, t[name])  # results stay on the rank's device
            assert t[name][1] == c[name][1], (name, rank)


@pytest.mark.slow
def test_ddp_trains_a_tiny_llama_as_gloo_on_cpu() -> None:
    cpu, tpu = _torchrun("cpu", "ddp"), _torchrun("tpu", "ddp")
    for rank, (c, t) in enumerate(zip(cpu, tpu, strict=True)):
        assert t["devices"] == [f"tpu:{rank}"]
        assert max(abs(a - b) for a, b in zip(c["losses"], t["losses"], strict=True)) < 1e-5
        assert max(abs(a - b) for a, b in zip(c["weights"], t["weights"], strict=True)) < 1e-4
    # DDP kept the replicas equal
    assert tpu[0]["weights"] == tpu[1]["weights"]


@pytest.mark.slow
def test_dtensor_tensor_parallel_trains_as_gloo_on_cpu() -> None:
    cpu, tpu = _torchrun("cpu", "tp"), _torchrun("tpu", "tp")
    for rank, (c, t) in enumerate(zip(cpu, tpu, strict=True)):
        assert t["shard"] == ["DTensor", f"tpu:{rank}", [32, 32]]  # half of gate_proj's 64 rows on each rank
        assert max(abs(a - b) for a, b in zip(c["losses"], t["losses"], strict=True)) < 1e-5
        # foreach AdamW over DTensors and plain tensors: PyTorch's own refusal, the same on CPU
        assert "mixed torch.Tensor and DTensor" in t["foreach_error"] and t["foreach_error"] == c["foreach_error"]


@pytest.mark.slow
def test_fsdp2_fully_shard_trains_as_gloo_on_cpu() -> None:
    """FSDP2 frees unsharded parameters with untyped_storage().resize_(0) and gathers them again into the
    re-allocated storage (hf_tpu/storage_ops.resize_storage, through the C++ hooks)."""
    cpu, tpu = _torchrun("cpu", "fsdp"), _torchrun("tpu", "fsdp")
    for rank, (c, t) in enumerate(zip(cpu, tpu, strict=True)):
        assert t["shard"] == ["DTensor", f"tpu:{rank}", [32, 32]]  # half of gate_proj's 64 rows on each rank
        assert t["freed_bytes"][0] > 0 and t["freed_bytes"][1] == c["freed_bytes"][1] == 0  # freed, as on CPU
        assert max(abs(a - b) for a, b in zip(c["losses"], t["losses"], strict=True)) < 1e-5
        assert max(abs(a - b) for a, b in zip(c["weights"], t["weights"], strict=True)) < 1e-4


@pytest.mark.slow
def test_from_pretrained_tp_plan_auto_gives_cpu_logits(tmp_path) -> None:
    """Transformers' tensor parallelism (`tp_plan="auto"`, the model's own plan) on tpu under torchrun: a tiny
    Llama saved offline, loaded split over two ranks, gives the unsplit CPU model's logits."""
    import torch
    import transformers
    from _hf_tiny import llama

    from distributed_child import IDS

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama()).eval()
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        want = model(torch.tensor(IDS)).logits
    for rank, row in enumerate(_torchrun("tpu", "tp_plan", str(tmp_path))):
        # Transformers binds each rank to the current tpu device (torch_tpu gives a process one chip, tpu:0)
        assert row["device"] == "tpu:0" and row["shard"] == ["DTensor", "tpu:0", [32, 32]], row
        got = torch.tensor(row["logits"])
        assert got.shape == want.shape and (got - want).abs().max().item() < 1e-5, rank
