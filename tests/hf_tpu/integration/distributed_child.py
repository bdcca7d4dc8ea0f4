"""Run under `torchrun --nproc_per_node=2` by test_distributed.py:
`distributed_child.py tpu|cpu ddp|tp|fsdp|collectives`, or `distributed_child.py tpu tp_plan MODEL_DIR`.

ddp: DDP trains a tiny Llama 3 steps, each rank on tpu:LOCAL_RANK with backend="tpu_dist" (or on CPU with
gloo, the reference); prints the losses and a weight checksum. collectives: all_reduce,
all_gather_into_tensor, reduce_scatter_tensor, broadcast, all_to_all and all_to_all_single on tensors of
tpu:LOCAL_RANK (or CPU), printing their results. tp: DTensor tensor parallelism of the MLPs; fsdp: FSDP2;
tp_plan: Transformers' own tensor parallelism (below). One JSON line per rank."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist


def _setup(kind: str) -> torch.device:
    if kind == "tpu":
        import hf_tpu

        hf_tpu.set_matmul_precision("highest")
        local = int(os.environ["LOCAL_RANK"])
        torch.tpu.set_device(local)  # tpu:LOCAL_RANK exists: one tpu device per local rank under torchrun
        dist.init_process_group("tpu_dist")
        return torch.device("tpu", local)
    dist.init_process_group("gloo")
    return torch.device("cpu")


def ddp(device: torch.device) -> dict:
    import transformers
    from _hf_tiny import llama

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama()).to(device)
    wrapped = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(100 + dist.get_rank())  # each rank its own data
    losses = []
    for _ in range(3):
        ids = torch.randint(3, 99, (2, 8), generator=g).to(device)
        loss = wrapped(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"devices": sorted({str(p.device) for p in model.parameters()}), "losses": losses,
            "weights": [p.detach().double().sum().item() for p in model.parameters()]}


def tensor_parallel(device: torch.device) -> dict:
    """DTensor tensor parallelism: each decoder layer's MLP split colwise (gate, up) and rowwise (down) over
    the two ranks; every rank sees the same data, so the losses are the unsplit model's. AdamW without
    foreach: the other parameters stay plain tensors, and DTensor refuses a foreach op over a list mixing
    them with DTensors (tpu, like CUDA, is a foreach device, so foreach is its default; CPU is not)."""
    import transformers
    from _hf_tiny import llama
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama()).to(device)
    for layer in model.model.layers:
        parallelize_module(layer.mlp, mesh, {"gate_proj": ColwiseParallel(), "up_proj": ColwiseParallel(),
                                             "down_proj": RowwiseParallel()})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    g = torch.Generator().manual_seed(100)  # the same data on every rank
    losses = []
    for _ in range(3):
        ids = torch.randint(3, 99, (2, 8), generator=g).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    # foreach AdamW (the default on tpu and CUDA, foreach devices, since DTensor counts as a foreach type):
    # PyTorch's DTensor refuses a foreach op over DTensors and plain tensors, on any device (CPU with
    # foreach=True here; CUDA users meet it by default, e.g. pytorch/pytorch#153354)
    model(input_ids=ids, labels=ids).loss.backward()
    try:
        torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True).step()
        foreach_error = None
    except RuntimeError as exc:
        foreach_error = str(exc)
    shard = model.model.layers[0].mlp.gate_proj.weight
    return {"losses": losses, "shard": [type(shard).__name__, str(shard.to_local().device),
                                        list(shard.to_local().shape)], "foreach_error": foreach_error}


def fsdp(device: torch.device) -> dict:
    """FSDP2: each decoder layer and the whole model `fully_shard`ed over the two ranks (every parameter a
    DTensor sharded on dim 0), each rank its own data. FSDP2 frees each unsharded parameter after use with
    `untyped_storage().resize_(0)` and re-allocates it before the next all-gather (hf_tpu/storage_ops.py)."""
    import transformers
    from _hf_tiny import llama
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # the mesh names the device (FSDP2's default is the accelerator's, which hf-tpu makes tpu even for CPU)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama()).to(device)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(100 + dist.get_rank())  # each rank its own data
    losses = []
    for _ in range(3):
        ids = torch.randint(3, 99, (2, 8), generator=g).to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    shard = model.model.layers[0].mlp.gate_proj.weight
    # a layer's all-gather output after the step: FSDP2 resized its storage to 0 bytes after backward
    gathered = model.model.layers[0]._get_fsdp_state()._fsdp_param_group.fsdp_params[0].all_gather_outputs[0]
    return {"losses": losses, "shard": [type(shard).__name__, str(shard.to_local().device),
                                        list(shard.to_local().shape)],
            "freed_bytes": [gathered.numel() * gathered.element_size(), gathered.untyped_storage().size()],
            "weights": [p.full_tensor().double().sum().item() for p in model.parameters()]}


def collectives(device: torch.device) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    base = torch.arange(4 * world, dtype=torch.float32) + 10 * rank  # differs per rank
    out: dict = {}

    x = base.clone().to(device)
    dist.all_reduce(x)
    out["all_reduce"] = [str(x.device), x.cpu().tolist()]

    gathered = torch.empty(world * base.numel(), device=device)
    dist.all_gather_into_tensor(gathered, base.to(device))
    out["all_gather_into_tensor"] = [str(gathered.device), gathered.cpu().tolist()]

    part = torch.empty(base.numel() // world, device=device)
    dist.reduce_scatter_tensor(part, base.to(device))
    out["reduce_scatter_tensor"] = [str(part.device), part.cpu().tolist()]

    b = base.clone().to(device)
    dist.broadcast(b, src=1)
    out["broadcast"] = [str(b.device), b.cpu().tolist()]

    single = torch.empty_like(base, device=device)
    dist.all_to_all_single(single, base.to(device))
    out["all_to_all_single"] = [str(single.device), single.cpu().tolist()]

    # functional collectives (DTensor's and FSDP2's): C++ calls the group's coalesced forms
    import torch.distributed._functional_collectives as funcol

    g = dist.group.WORLD
    for name, r in (("funcol_all_gather", funcol.all_gather_tensor(base.to(device), 0, g)),
                    ("funcol_reduce_scatter", funcol.reduce_scatter_tensor(base.to(device), "sum", 0, g)),
                    ("funcol_all_reduce", funcol.all_reduce(base.to(device), "sum", g))):
        r = funcol.wait_tensor(r)
        out[name] = [str(r.device), r.cpu().tolist()]

    ins = [c.to(device) for c in base.chunk(world)]
    outs = [torch.empty_like(c) for c in ins]
    dist.all_to_all(outs, ins)
    out["all_to_all"] = [str(outs[0].device), [o.cpu().tolist() for o in outs]]
    return out


IDS = [[5, 17, 42, 8, 91, 3, 66, 20], [7, 7, 30, 61, 2, 88, 14, 50]]


def tp_plan_auto(path: str) -> dict:
    """`from_pretrained(path, tp_plan="auto")` as a user's script under torchrun does it: Transformers starts
    the process group (tpu's default backend, tpu_dist) and binds each rank's device itself, then splits the
    model with its own plan (DTensors over the two ranks); the logits of IDS."""
    import hf_tpu
    import transformers

    hf_tpu.set_matmul_precision("highest")
    model = transformers.AutoModelForCausalLM.from_pretrained(path, tp_plan="auto")
    with torch.no_grad():
        logits = model(torch.tensor(IDS).to(model.device)).logits
    weight = model.model.layers[0].mlp.gate_proj.weight
    return {"device": str(model.device), "logits": logits.cpu().tolist(),
            "shard": [type(weight).__name__, str(weight.to_local().device), list(weight.to_local().shape)]}


if __name__ == "__main__":
    kind, what = sys.argv[1], sys.argv[2]
    if what == "tp_plan":
        result = {"rank": int(os.environ["RANK"]), **tp_plan_auto(sys.argv[3])}
        print("RESULT " + json.dumps(result), flush=True)
        sys.exit(0)
    device = _setup(kind)
    run = {"ddp": ddp, "tp": tensor_parallel, "fsdp": fsdp, "collectives": collectives}[what]
    result = {"rank": dist.get_rank(), **run(device)}
    print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()
