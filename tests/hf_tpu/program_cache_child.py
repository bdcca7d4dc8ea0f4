"""Run by tests/hf_tpu/test_program_cache.py in a fresh process: eager ops on tpu, compared with CPU; prints
one JSON line (the largest error, the program tier's counts, how many programs JAX lowered)."""

import json
import os
import warnings

import torch

import hf_tpu

lowerings = 0


def _count_lowerings() -> None:
    """JAX lowers a program to MLIR before it can even look it up in its own persistent cache."""
    from jax._src.interpreters import mlir

    original = mlir.lower_jaxpr_to_module

    def counted(*a, **k):  # noqa: ANN002, ANN003, ANN202
        global lowerings
        lowerings += 1
        return original(*a, **k)

    mlir.lower_jaxpr_to_module = counted


def ops(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    h = torch.nn.functional.linear(x, w)
    return [torch.add(h, x, alpha=0.5), torch.softmax(h, -1), torch.nn.functional.layer_norm(h, (8,)),
            (h.t() * 2).contiguous(), torch.cat([x, h], 0), torch.nn.functional.gelu(h)]


def main() -> None:
    hf_tpu.set_matmul_precision(os.environ.get("CHILD_PRECISION", "highest"))
    torch.manual_seed(0)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    (torch.ones(2, device="tpu") + 1).cpu()  # start JAX before counting
    _count_lowerings()
    hf_tpu.reset_compile_stats()
    if os.environ.get("CHILD_INJECT") == "1":
        # a changed lowering: add computes a - alpha * b (the op's lowering replaced at run time)
        from hf_tpu import lowering

        original_find = lowering.find

        def find(op):  # noqa: ANN001, ANN202
            if op is torch.ops.aten.add.Tensor:
                return lambda a, b, alpha=1: a - alpha * b
            return original_find(op)

        lowering.find = find
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [t.cpu() for t in ops(x.to("tpu"), w.to("tpu"))]
    want = ops(x, w)
    print(json.dumps({
        "errs": [(g - e).abs().max().item() for g, e in zip(got, want, strict=True)],
        "inject_err": (got[0] - (torch.nn.functional.linear(x, w) - 0.5 * x)).abs().max().item(),
        "programs": hf_tpu.compile_stats()["tiers"]["programs"],
        "lowerings": lowerings,
        "warnings": [str(m.message) for m in caught if "compile cache" in str(m.message)],
    }))


if __name__ == "__main__":
    main()
