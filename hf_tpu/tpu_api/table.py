"""The one declarative table of `torch.tpu`: every public name of torch_tpu 0.2.0, where hf-tpu implements it,
its lifecycle stage as TorchTPU annotates it, and whether it needs TPU hardware.

Read by `hf_tpu.tpu_api.build` (which turns it into modules) and by `benchmarks/torch_tpu_parity.py` (which
compares it with the wheel's `_PUBLIC_MODULES`). A target is `"module:attribute"` under `hf_tpu.tpu_api`; a
`Property` is a module-level property (assignable: `torch.tpu.eager_mode = ...`); `HARDWARE` marks a name
that exists and raises `TpuHardwareRequired` when used."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Export:
    target: str | None  # "module:attr" under hf_tpu.tpu_api; None when the name needs TPU hardware
    experimental: bool = False
    prop: bool = False  # a property on the module (getter/setter), like TorchTPU's `Property`

    @property
    def hardware_only(self) -> bool:
        return self.target is None


def E(target: str, *, stable: bool = False) -> Export:  # noqa: N802 - short constructor for the table
    return Export(target, experimental=not stable)


def P(target: str) -> Export:  # noqa: N802
    return Export(target, experimental=True, prop=True)


HARDWARE = Export(None, experimental=True)

# Stages follow torch_tpu 0.2.0's annotations: most of torch.tpu is @experimental; max_pool* are @stable;
# current_device / is_available / set_device / device / device_of(stable) carry no annotation.
TABLE: Mapping[str, Mapping[str, Export]] = {
    "torch.tpu": {
        "EagerMode": E("modes:EagerMode"),
        "Event": E("streams:Event"),
        "Precision": E("modes:Precision"),
        "Stream": E("streams:Stream"),
        "allow_excess_precision": P("modes:allow_excess_precision"),
        "current_device": E("device_api:current_device", stable=True),
        "current_stream": E("streams:current_stream"),
        "default_generators": P("device_api:default_generators"),
        "default_stream": E("streams:default_stream"),
        "device": E("device_api:device", stable=True),
        "device_count": E("device_api:device_count"),
        "device_of": E("device_api:device_of"),
        "eager_mode": P("modes:eager_mode"),
        "get_amp_supported_dtype": E("device_api:get_amp_supported_dtype"),
        "get_device_name": E("device_api:get_device_name"),
        "get_device_properties": E("device_api:get_device_properties"),
        "get_rng_state": E("device_api:get_rng_state"),
        "initial_seed": E("device_api:initial_seed"),
        "is_available": E("device_api:is_available", stable=True),
        "is_initialized": E("device_api:is_initialized"),
        "manual_seed": E("device_api:manual_seed"),
        "manual_seed_all": E("device_api:manual_seed_all"),
        "precision": E("modes:precision"),
        "set_device": E("device_api:set_device", stable=True),
        "set_eager_mode": E("modes:set_eager_mode"),
        "set_rng_state": E("device_api:set_rng_state"),
        "set_stream": E("streams:set_stream"),
        "stream": E("streams:stream"),
        "synchronize": E("device_api:synchronize"),
        "topology_aware_mesh": HARDWARE,
    },
    "torch.tpu.compiler": {
        "custom_compiler_options": E("compiler:custom_compiler_options"),
    },
    "torch.tpu.distributed": {
        "set_tpu_launch_env": HARDWARE,
        "spmd_safe": E("distributed:spmd_safe"),
        "topology_aware_mesh": HARDWARE,
        "window_num_stripes": HARDWARE,
        "window_stripe_chunk_mb": HARDWARE,
    },
    "torch.tpu.ops": {
        "align_jagged_to_multiple": E("ops:align_jagged_to_multiple"),
        "all_gather_dim": HARDWARE,
        "max_pool1d": E("ops:max_pool1d", stable=True),
        "max_pool1d_backward": E("ops:max_pool1d_backward", stable=True),
        "max_pool2d": E("ops:max_pool2d", stable=True),
        "max_pool2d_backward": E("ops:max_pool2d_backward", stable=True),
        "max_pool3d": E("ops:max_pool3d", stable=True),
        "max_pool3d_backward": E("ops:max_pool3d_backward", stable=True),
        "optimization_barrier": E("ops:optimization_barrier"),
        "ragged_all_to_all": HARDWARE,
        "ragged_dot": E("ops:ragged_dot"),
        "ragged_dot_weight_grad": E("ops:ragged_dot_weight_grad"),
        "recv": HARDWARE,
        "reduce_scatter_dim": HARDWARE,
        "send": HARDWARE,
        "sparse_dense_matmul": HARDWARE,
        "sparse_dense_matmul_activation_unstack": HARDWARE,
        "sparse_dense_matmul_grad_with_adagrad": HARDWARE,
        "sparse_dense_matmul_grad_with_adam": HARDWARE,
        "sparse_dense_matmul_grad_with_sgd": HARDWARE,
        "sparse_dense_matmul_gradient_stack": HARDWARE,
        "sparse_gather": HARDWARE,
        "sparse_gather_backward": HARDWARE,
        "sparse_iota": HARDWARE,
        "sparse_map_row": HARDWARE,
        "splash_sdpa": E("ops:splash_sdpa"),
        "strip_jagged_padding": E("ops:strip_jagged_padding"),
    },
    "torch.tpu.optimizers": {
        "AdamW": E("optimizers:AdamW"),
        "Muon": E("optimizers:Muon"),
        "Optimizer": E("optimizers:Optimizer"),
        "Sgd": E("optimizers:Sgd"),
        "SingleTraceTrainer": HARDWARE,
    },
    "torch.tpu.pallas": {
        "get_pallas_mesh": HARDWARE,
        "jax_op": E("pallas:jax_op"),
    },
    "torch.tpu.profiler": {
        "TpuProfilerConfig": E("profiler:TpuProfilerConfig"),
    },
}

# Names PyTorch and Accelerate look up on a device module that torch_tpu serves through its private fallback
# (`_is_in_bad_fork`, ...) or that older hf-tpu exposed: kept so existing callers work.
EXTRAS: Mapping[str, str] = {
    "_is_in_bad_fork": "device_api:_is_in_bad_fork",
    "seed": "device_api:seed",
    "seed_all": "device_api:seed",
    "is_bf16_supported": "device_api:is_bf16_supported",
    "empty_cache": "device_api:empty_cache",
    "memory_allocated": "device_api:memory_allocated",
    "max_memory_allocated": "device_api:max_memory_allocated",
    "reset_peak_memory_stats": "device_api:reset_peak_memory_stats",
}
