"""torch.tpu = torch_tpu 0.2.0's public API (hf_tpu/tpu_api): each behaviour against CPU PyTorch."""

import math
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from hf_tpu import fused, precision as P
from hf_tpu.tpu_api import table
from hf_tpu.tpu_api.errors import TpuHardwareRequired


def test_every_table_name_resolves_and_hardware_names_raise() -> None:
    for module, exports in table.TABLE.items():
        mod = sys.modules[module]
        assert sorted(exports) == sorted(n for n in mod.__all__ if f"{module}.{n}" not in table.TABLE)
        for name, exp in exports.items():
            if exp.hardware_only and not exp.prop:
                with pytest.raises(TpuHardwareRequired, match="needs TPU hardware"):
                    getattr(mod, name)()
            elif not exp.prop:
                assert getattr(mod, name) is not None
    assert "precision" in torch.tpu.__tt_api_stages__ and "max_pool2d" not in torch.tpu.ops.__tt_api_stages__
    from torch.tpu import ops  # submodules import as modules

    assert ops is torch.tpu.ops


def test_precision_context_and_torch_agree(precision) -> None:
    precision("medium")
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        assert torch.get_float32_matmul_precision() == "highest" and P.current() == "highest"
        inside = (a.to("tpu") @ b.to("tpu")).cpu()
    assert torch.get_float32_matmul_precision() == "medium" and P.current() == "medium"
    outside = (a.to("tpu") @ b.to("tpu")).cpu()
    ref = (a.double() @ b.double()).float()
    assert (inside - ref).abs().max() < 1e-4 < (outside - ref).abs().max()
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):
        assert torch.get_float32_matmul_precision() == "medium"
    with pytest.raises(ValueError, match="Precision"):
        with torch.tpu.precision("highest"):
            pass


def test_eager_modes_switch_strict_launch_blocking_and_fused() -> None:
    E = torch.tpu.EagerMode
    start = torch.tpu.eager_mode
    with torch.tpu.set_eager_mode(E.DEFER_AND_FUSE):
        assert fused.active() and torch.tpu.eager_mode is E.DEFER_AND_FUSE
        x = torch.ones(4, device="tpu") * 2 + 1
        with torch.tpu.set_eager_mode(E.DEFER_NEVER_AND_LAUNCH_BLOCKING):
            assert fused.LAUNCH_BLOCKING and not fused.active()
            with pytest.raises(RuntimeError, match="aten::"):
                torch.ones(3, device="tpu") @ torch.ones(4, device="tpu")
        assert fused.active() and not fused.LAUNCH_BLOCKING
        assert torch.equal(x.cpu(), torch.full((4,), 3.0))
    assert torch.tpu.eager_mode is start
    torch.tpu.eager_mode = E.DEFER_AND_FUSE
    try:
        assert fused.active()
    finally:
        torch.tpu.eager_mode = start
    with pytest.raises(TypeError, match="EagerMode"):
        torch.tpu.eager_mode = "fused"


def test_rng_state_round_trips() -> None:
    torch.tpu.manual_seed(123)
    s = torch.tpu.get_rng_state()
    first = torch.rand(5, device="tpu").cpu()
    torch.rand(7, device="tpu")
    torch.tpu.set_rng_state(s)
    assert torch.equal(torch.rand(5, device="tpu").cpu(), first)
    gen = torch.tpu.default_generators[0]
    assert torch.tpu.default_generators is torch.tpu.default_generators
    gen.manual_seed(5)
    assert torch.tpu.initial_seed() == 5
    with pytest.raises(ValueError, match="bytes"):
        torch.tpu.set_rng_state(torch.zeros(3 * 4, dtype=torch.uint8))


def test_device_helpers_and_properties() -> None:
    props = torch.tpu.get_device_properties(0)
    assert props.total_memory == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") > 0
    with torch.tpu.device(0), torch.tpu.device_of(torch.ones(1, device="tpu")), torch.tpu.device_of(torch.ones(1)):
        assert torch.tpu.current_device() == 0
    with pytest.raises(RuntimeError, match=r"tpu:1 is not a valid device.*HF_TPU_NUM_DEVICES"):
        torch.tpu.device(1).__enter__()
    assert torch.tpu.allow_excess_precision is False
    torch.tpu.allow_excess_precision = True
    assert torch.tpu.allow_excess_precision is True
    torch.tpu.allow_excess_precision = False


def test_streams_and_events() -> None:
    s = torch.tpu.Stream()
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record(s)
    with torch.tpu.stream(s):
        assert torch.tpu.current_stream() == s
        x = torch.randn(256, 256, device="tpu")
        for _ in range(5):
            x = x @ x / 16
        time.sleep(0.01)
    end.record()
    end.synchronize()
    assert end.query() and s.query()
    assert end.elapsed_time(start) < 0 < 10 <= start.elapsed_time(end)
    torch.tpu.default_stream().wait_stream(s)
    s.wait_event(end)
    with pytest.raises(RuntimeError, match="enable_timing"):
        torch.tpu.Event().elapsed_time(end)


def test_ragged_dot_and_weight_grad_match_per_group_matmuls() -> None:
    lhs, rhs = torch.randn(10, 6), torch.randn(3, 6, 4)
    sizes = torch.tensor([3, 0, 7])
    ref = torch.cat([lhs[:3] @ rhs[0], lhs[3:] @ rhs[2]])
    for dev in ("cpu", "tpu"):
        a, b = lhs.clone().to(dev).requires_grad_(), rhs.clone().to(dev).requires_grad_()
        out = torch.tpu.ops.ragged_dot(a, b, sizes.to(dev))
        torch.testing.assert_close(out.cpu(), ref, atol=2e-2, rtol=2e-2)
        g = torch.randn(10, 4)
        out.backward(g.to(dev))
        wg = torch.tpu.ops.ragged_dot_weight_grad(lhs.to(dev), g.to(dev), sizes.to(dev)).cpu()
        torch.testing.assert_close(b.grad.cpu(), wg, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(wg[1], torch.zeros(6, 4))
        torch.testing.assert_close(wg[0], lhs[:3].T @ g[:3], atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="sum to 9"):
        torch.tpu.ops.ragged_dot(lhs, rhs, torch.tensor([3, 0, 6]))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_max_pool_and_backward(n: int) -> None:
    x = torch.randn(2, 3, *([7] * n))
    x_unbatched = x[0]
    args = ([3] * n, [2] * n, [1] * n, [1] * n, True)
    ref_x = x.clone().requires_grad_()
    ref = [F.max_pool1d, F.max_pool2d, F.max_pool3d][n - 1](ref_x, *args)
    g = torch.randn_like(ref)
    ref.backward(g)
    pool = getattr(torch.tpu.ops, f"max_pool{n}d")
    back = getattr(torch.tpu.ops, f"max_pool{n}d_backward")
    for dev in ("cpu", "tpu"):
        torch.testing.assert_close(pool(x.to(dev), *args).cpu(), ref.detach())
        torch.testing.assert_close(back(g.to(dev), x.to(dev), *args).cpu(), ref_x.grad)
    ref1 = [F.max_pool1d, F.max_pool2d, F.max_pool3d][n - 1](x_unbatched, *args)
    torch.testing.assert_close(back(g[0].to("tpu"), x_unbatched.to("tpu"), *args).cpu(), ref_x.grad[0])
    torch.testing.assert_close(pool(x_unbatched.to("tpu"), *args).cpu(), ref1)
    with pytest.raises(ValueError, match="values each"):
        pool(x, [3] * (n + 1), *args[1:])


def test_splash_sdpa_is_sdpa_with_windows_and_gqa() -> None:
    # seeded, at "highest": at the default "medium" the products round their operands to bfloat16, and random
    # inputs now and then differed from CPU's float32 by more than the 1e-2 this compared with
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 9, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        out = torch.tpu.ops.splash_sdpa(q.to("tpu"), k.to("tpu"), v.to("tpu"), enable_gqa=True, block_q=128).cpu()
    finally:
        torch.set_float32_matmul_precision(before)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    win = torch.tpu.ops.splash_sdpa(q, kk, vv, local_window_size=2)
    i = torch.arange(9)
    scores = (q @ kk.transpose(-1, -2)) / math.sqrt(8)
    allowed = (i[:, None] - i[None, :] >= 0) & (i[:, None] - i[None, :] <= 2)
    torch.testing.assert_close(win, scores.masked_fill(~allowed, -math.inf).softmax(-1) @ vv)
    with pytest.raises(ValueError, match="enable_gqa"):
        torch.tpu.ops.splash_sdpa(q, k, v)


def test_optimization_barrier_and_jagged_helpers() -> None:
    a, b = torch.randn(3, device="tpu"), torch.randn(2, device="tpu")
    out = torch.tpu.ops.optimization_barrier([a, b])
    assert torch.equal(out[0].cpu(), a.cpu()) and torch.equal(out[1].cpu(), b.cpu())
    nt = torch.nested.nested_tensor([torch.randn(3, 4), torch.randn(2, 4)], layout=torch.jagged)
    padded = torch.tpu.ops.align_jagged_to_multiple(nt, 8, padding_value=-1.0)
    assert padded.values().shape == (8, 4) and torch.equal(padded.offsets(), nt.offsets())
    assert torch.equal(padded.values()[5:], torch.full((3, 4), -1.0))
    stripped = torch.tpu.ops.strip_jagged_padding(padded)
    assert torch.equal(stripped.values(), nt.values())


def test_jax_op_runs_jax_on_torch_tensors() -> None:
    import jax
    import jax.numpy as jnp

    @torch.tpu.pallas.jax_op("hf_tpu_test::scaled_sin")
    def scaled_sin(x: jax.Array, y: jax.Array, scale: float) -> tuple[jax.Array, jax.Array]:
        return jnp.sin(x) * scale, x @ y

    x, y = torch.randn(3, 4), torch.randn(4, 2)
    for dev in ("cpu", "tpu"):
        s, m = scaled_sin(x.to(dev), y.to(dev), 2.0)
        assert s.device.type == dev
        torch.testing.assert_close(s.cpu(), torch.sin(x) * 2)
        torch.testing.assert_close(m.cpu(), x @ y, atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="namespace"):
        torch.tpu.pallas.jax_op("nonamespace", lambda x: x)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _run_functional(opt, steps: int = 4):
    model = _model()
    group = opt.init_param_group(model)
    for i in range(steps):
        torch.manual_seed(100 + i)
        grads = {k: torch.randn_like(p) for k, p in group.params.items()}
        group = opt.step(group, grads)
    return group


def _run_torch(make, steps: int = 4):
    model = _model()
    opt = make(model.parameters())
    for i in range(steps):
        torch.manual_seed(100 + i)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    return {n.replace(".", "_"): p.detach() for n, p in model.named_parameters()}


def test_adamw_and_sgd_equal_torch_optim() -> None:
    ours = _run_functional(torch.tpu.optimizers.AdamW(lr=1e-2, weight_decay=0.1, use_bfloat16_moments=False))
    ref = _run_torch(lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1))
    for k in ref:
        torch.testing.assert_close(ours.params[k], ref[k])
    bf16 = _run_functional(torch.tpu.optimizers.AdamW(lr=1e-2))
    assert all(m.dtype == torch.bfloat16 for m in bf16.opt_state_m.values())
    ours = _run_functional(torch.tpu.optimizers.Sgd(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01,
                                                    nesterov=False))
    ref = _run_torch(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01))
    for k in ref:
        torch.testing.assert_close(ours.params[k], ref[k])
    assert torch.tpu.optimizers.Sgd(lr=0.5).defaults["lr"] == 0.5


def test_muon_follows_its_published_update() -> None:
    def newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
        # Keller Jordan's Muon: quintic Newton-Schulz iteration in bfloat16
        a, b, c = 3.4445, -4.7750, 2.0315
        x = g.bfloat16()
        tall = g.size(0) > g.size(1)
        x = x.T if tall else x
        x = x / x.norm().clamp(min=1e-7)
        for _ in range(steps):
            A = x @ x.T
            B = b * A + c * A @ A
            x = a * x + B @ x
        return x.T if tall else x

    torch.manual_seed(0)
    w = torch.randn(6, 4)
    opt = torch.tpu.optimizers.Muon(lr=0.02, weight_decay=0.1, momentum=0.95)
    group = opt.init_param_group({"w": w.clone()})
    ref, buf = w.clone(), torch.zeros_like(w)
    for i in range(3):
        g = torch.randn(6, 4)
        group = opt.step(group, {"w": g})
        buf = 0.95 * buf + 0.05 * g
        update = newton_schulz(0.05 * g + 0.95 * buf).float()
        ref = ref * (1 - 0.02 * 0.1) - 0.02 * math.sqrt(max(1, 6 / 4)) * update
    torch.testing.assert_close(group.params["w"], ref, atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="2-D"):
        opt.init_param_group({"b": torch.zeros(3)})


def test_compiler_options_nest_and_profiler_config(tmp_path, monkeypatch) -> None:
    from hf_tpu.tpu_api.compiler import current_options

    with torch.tpu.compiler.custom_compiler_options({"xla_optimization_level": "O1", "a": "1"}):
        with torch.tpu.compiler.custom_compiler_options({"xla_optimization_level": "O2"}):
            assert current_options() == {"xla_optimization_level": "O2", "a": "1"}
        assert current_options()["xla_optimization_level"] == "O1"
    assert current_options() == {}
    with pytest.raises(ValueError, match="O0"):
        with torch.tpu.compiler.custom_compiler_options({"xla_optimization_level": "fast"}):
            pass
    monkeypatch.setenv("TORCH_TPU_PROFILER_OUTPUT_DIR", str(tmp_path))
    cfg = torch.tpu.profiler.TpuProfilerConfig(worker_rank="3", experimental_options={"k": "v"})
    assert cfg.parts == ["host_tracer_level:2", "device_tracer_level:1", "python_tracer_level:0",
                         f"run_dir:{tmp_path}", 'worker_rank:"3"', 'k:"v"', "check_experimental_options:true"]
    with torch.profiler.profile(experimental_config=cfg) as prof:
        torch.ones(2, device="tpu") + 1
    assert prof.key_averages()
    with pytest.raises(ValueError, match="clash"):
        torch.tpu.profiler.TpuProfilerConfig(experimental_options={"run_dir": "x"})


def test_legacy_device_api_policy() -> None:
    code = "import torch; torch.tpu.synchronize(); print(torch.tpu.device_count())"
    env = {**os.environ, "TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS": "0"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "torch.accelerator.synchronize" in r.stderr
    env["TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS"] = "1"
    r = subprocess.run([sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "1" and "use torch.accelerator.device_count" in r.stderr
