"""XLA programs per steady optimizer step on tpu, by ATen op, for fused and foreach AdamW and friends.

  HF_HUB_OFFLINE=1 python benchmarks/optimizer_step_programs.py [--layers 6] [--width 64] [--steps 4]

A GPT-2 built from a config (6 layers: 76 parameters; no Hub) on tpu; for each optimizer configuration, in
one process: forward, backward, then `--steps` steps, the last of which is measured: the XLA programs eager
mode ran in `opt.step()` (hf_tpu.counters' `eager_programs`) split by the ATen op being dispatched
(hooks.observe_ops; nested ops count inside the op that called them), programs made during that step (traced,
or loaded from the executable cache: a new signature), the step's CPU-seconds, and the programs run by
`opt.zero_grad()`. Not a test: CPU-seconds depend on the machine's load.
"""

from __future__ import annotations

import argparse
import collections
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CONFIGS = {
    "AdamW(fused)": dict(cls="AdamW", fused=True),
    "AdamW(fused, capturable)": dict(cls="AdamW", fused=True, capturable=True),
    "AdamW(fused) + GradScaler": dict(cls="AdamW", fused=True, scaler=True),
    "AdamW() default (foreach)": dict(cls="AdamW"),
    "AdamW(foreach, capturable)": dict(cls="AdamW", foreach=True, capturable=True),
    "AdamW(foreach) + clip_grad_norm_": dict(cls="AdamW", foreach=True, clip=True),
    "SGD(fused, momentum)": dict(cls="SGD", fused=True, momentum=0.9),
    "SGD(foreach, momentum)": dict(cls="SGD", foreach=True, momentum=0.9),
}


def measure(name: str, cfg: dict, layers: int, width: int, steps: int) -> None:
    import torch
    import transformers

    from hf_tpu import counters, executable_cache, hooks, op_jit, optim_lowerings

    cfg = dict(cfg)
    cls = getattr(torch.optim, cfg.pop("cls"))
    scaler_on, clip = cfg.pop("scaler", False), cfg.pop("clip", False)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=1000, n_positions=64,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).to("tpu").train()
    opt = cls(model.parameters(), lr=1e-3, **cfg)
    scaler = torch.amp.GradScaler("tpu") if scaler_on else None
    ids = torch.randint(0, 1000, (2, 16)).to("tpu")

    def made() -> int:
        return op_jit.traces + optim_lowerings.traces + executable_cache.stats()["hits"]

    per: collections.Counter[str] = collections.Counter()

    def observe(dispatch, op, args, kwargs):  # noqa: ANN001, ANN202
        before = counters.count("eager_programs")
        try:
            return dispatch(op, args, kwargs)
        finally:
            per[str(op)] += counters.count("eager_programs") - before

    for k in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        (scaler.scale(loss) if scaler else loss).backward()
        last = k == steps - 1
        if last:
            per.clear()
            m0, p0, c0 = made(), counters.count("eager_programs"), time.process_time()
        with hooks.observe_ops(observe) if last else _nothing():
            if scaler:
                scaler.unscale_(opt)
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            next(model.parameters()).detach().cpu()  # the step finished
        if last:
            cpu_s, programs, new = time.process_time() - c0, counters.count("eager_programs") - p0, made() - m0
            z0 = counters.count("eager_programs")
        opt.zero_grad()
    zero = counters.count("eager_programs") - z0
    top = ", ".join(f"{op.removeprefix('aten.')} {n}" for op, n in per.most_common(6) if n)
    print(f"| {name} | {len(list(model.parameters()))} | {programs} | {new} | {cpu_s:.3f} | {zero} | {top} |")


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--only", default="", help="configuration names separated by ';' (default: all)")
    args = ap.parse_args()
    import torch
    import transformers

    import hf_tpu  # noqa: F401 - registers the tpu device

    torch.set_float32_matmul_precision("highest")
    transformers.utils.logging.set_verbosity_error()
    print("| optimizer | parameters | programs per step | programs made in it | step CPU-s | zero_grad programs "
          "| programs by op |")
    print("|---|---|---|---|---|---|---|")
    for name, cfg in CONFIGS.items():
        if args.only and name not in args.only.split(";"):
            continue
        measure(name, cfg, args.layers, args.width, args.steps)


if __name__ == "__main__":
    main()
