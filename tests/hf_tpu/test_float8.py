"""float8 on tpu (float8.py): every PyTorch float8 dtype is created, converted both ways with CPU's rounding and
saturation, viewed, copied, saved, loaded and printed as on CPU; the ops CPU has for float8 give CPU's bits;
torch._scaled_mm (tensor-wise and rowwise scales, every output dtype CPU accepts, bias) equals CPU's."""

from __future__ import annotations

import io

import pytest
import torch

from hf_tpu.precision import cpu_reference

F8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu)
IDS = [str(d).removeprefix("torch.float8_") for d in F8]
WIDE = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _same(expected: torch.Tensor, actual: torch.Tensor) -> None:
    """Same dtype, shape and bits (NaN encodings included)."""
    assert actual.device.type == "tpu"
    actual = actual.cpu()
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if expected.dtype in F8:
        assert torch.equal(actual.view(torch.uint8), expected.view(torch.uint8))
    else:
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def _values() -> torch.Tensor:
    """Every magnitude class a conversion can meet: tiny (subnormal), normal, beyond each type's range,
    +-0, +-inf, NaN."""
    gen = torch.Generator().manual_seed(0)
    scales = (1e-6, 1e-3, 1.0, 30.0, 300.0, 1e4, 1e6, 1e30)
    rand = torch.cat([torch.randn(256, generator=gen) * s for s in scales])
    edges = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 448.0, 449.0, 464.0, 480.0,
                          240.0, 248.0, 57344.0, 61440.0, 2.0 ** -127, 1.5 * 2.0 ** -127, 3e38, -1.0, -3.0])
    return torch.cat([rand, edges])


@pytest.mark.parametrize("src", WIDE, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("dtype", F8, ids=IDS)
def test_to_float8_rounds_and_saturates_as_cpu(dtype: torch.dtype, src: torch.dtype) -> None:
    x = _values().to(src)
    _same(x.to(dtype), x.to("tpu").to(dtype))


@pytest.mark.parametrize("dtype", F8, ids=IDS)
def test_integers_to_float8_as_cpu(dtype: torch.dtype) -> None:
    x = torch.tensor([0, 1, -1, 7, 300, 449, 70000, -70000, 2**40], dtype=torch.int64)
    _same(x.to(dtype), x.to("tpu").to(dtype))


@pytest.mark.parametrize("dtype", F8, ids=IDS)
def test_from_float8_every_bit_pattern(dtype: torch.dtype) -> None:
    """All 256 encodings to every wider float dtype, to integers (finite ones) and to each other float8 type."""
    bits = torch.arange(256, dtype=torch.uint8)
    x, t = bits.view(dtype), bits.to("tpu").view(dtype)
    _same(x, t)
    for dst in (*WIDE, *(d for d in F8 if d != dtype)):
        _same(x.to(dst), t.to(dst))
    finite = torch.isfinite(x.float()) & (x.float().abs() < 2**31)  # beyond: undefined behaviour in C++
    for dst in (torch.int32, torch.int64, torch.bool):
        _same(x[finite].to(dst), t[finite.to("tpu")].to(dst))


@pytest.mark.parametrize("dtype", F8, ids=IDS)
def test_creation_views_copies(dtype: torch.dtype) -> None:
    ref = torch.tensor([[1.0, 2.0, 0.5], [4.0, 0.25, 8.0]])
    _same(ref.to(dtype), torch.tensor(ref.tolist(), dtype=dtype, device="tpu"))
    _same(torch.zeros(2, 3, dtype=dtype), torch.zeros(2, 3, dtype=dtype, device="tpu"))
    _same(torch.ones(2, 3, dtype=dtype), torch.ones(2, 3, dtype=dtype, device="tpu"))
    _same(torch.full((2, 3), 2.0, dtype=dtype), torch.full((2, 3), 2.0, dtype=dtype, device="tpu"))
    _same(torch.eye(3, dtype=dtype), torch.eye(3, dtype=dtype, device="tpu"))
    x = ref.to(dtype)
    t = x.to("tpu")
    _same(torch.zeros_like(x), torch.zeros_like(t))
    _same(x.view(torch.uint8), t.view(torch.uint8))
    _same(x.view(torch.int8), t.view(torch.int8))
    _same(x.view(torch.uint8).view(dtype), t.view(torch.uint8).view(dtype))
    _same(x.t().contiguous(), t.t().contiguous())
    _same(x[:, 1:].clone(), t[:, 1:].clone())
    # copies across dtypes and devices
    dst = torch.zeros(2, 3, dtype=dtype, device="tpu")
    dst.copy_(ref.to("tpu") * 3)
    _same((ref * 3).to(dtype), dst)
    wide = torch.zeros(2, 3, device="tpu")
    wide.copy_(t)
    _same(x.float(), wide)
    cpu_dst = torch.empty(2, 3, dtype=dtype)
    cpu_dst.copy_(t)
    assert torch.equal(cpu_dst.view(torch.uint8), x.view(torch.uint8))


@pytest.mark.parametrize("dtype", F8, ids=IDS)
def test_save_load_print(dtype: torch.dtype) -> None:
    x = (torch.randn(3, 4, generator=torch.Generator().manual_seed(1)) * 10).to(dtype)
    t = x.to("tpu")
    buf = io.BytesIO()
    torch.save({"t": t}, buf)
    buf.seek(0)
    _same(x, torch.load(buf)["t"])
    buf.seek(0)
    back = torch.load(buf, map_location="cpu")["t"]
    assert back.device.type == "cpu" and torch.equal(back.view(torch.uint8), x.view(torch.uint8))
    assert repr(t) == repr(x)[:-1].replace(f", dtype={dtype}", f", device='tpu:0',\n       dtype={dtype}") + ")" \
        or repr(t).replace("device='tpu:0', ", "").replace("\n       ", " ") == repr(x).replace("\n       ", " ")


# The ops PyTorch's CPU kernels accept for float8 (probed on torch 2.13): name -> fn(a, b) (a, b: float8).
OPS = {
    "clone": lambda a, b: a.clone(),
    "cat": lambda a, b: torch.cat([a, b]),
    "stack": lambda a, b: torch.stack([a, b]),
    "index": lambda a, b: a[torch.tensor([0, 2], device=a.device)],
    "index_select": lambda a, b: a.index_select(1, torch.tensor([0, 3], device=a.device)),
    "masked_select": lambda a, b: a.masked_select(a.float() > 1),
    "where": lambda a, b: torch.where(a.float() > 1, a, b),
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "eq_scalar": lambda a, b: a == 1.0,
    "isnan": lambda a, b: a.isnan(),
    "any_all": lambda a, b: (a.any(), a.all()),
    "mul": lambda a, b: a * b,
    "mul_overflow": lambda a, b: a * b * a * b * a * b,
    "abs": lambda a, b: a.abs(),
    "mm": lambda a, b: a @ b.t(),
    "fill_zero": lambda a, b: (a.clone().fill_(2), a.clone().zero_()),
    "flip_roll": lambda a, b: (a.flip(0), a.roll(1, 0)),
    "repeat_expand": lambda a, b: (a.repeat(2, 1), a[:1].expand(3, 6).clone()),
    "index_put": lambda a, b: a.clone().index_put_((torch.tensor([0], device=a.device),), b[0]),
    "pad": lambda a, b: torch.nn.functional.pad(a, (1, 1)),
    "split_unbind": lambda a, b: [s.clone() for s in (*a.split(2), *a.unbind(0))],
    "narrow_diag": lambda a, b: (a.narrow_copy(0, 1, 2), a[:, :4].diag()),
    "new_zeros": lambda a, b: a.new_zeros(2, 2),
}


@pytest.mark.parametrize("dtype", F8, ids=IDS)
@pytest.mark.parametrize("name", sorted(OPS))
def test_ops_cpu_supports_match_bits(name: str, dtype: torch.dtype) -> None:
    x = torch.rand(4, 6, generator=torch.Generator().manual_seed(2)) * 30 + 0.5
    a, b = x.to(dtype), (x * 0.7).to(dtype)
    try:
        expected = OPS[name](a, b)
    except (RuntimeError, NotImplementedError):
        pytest.skip(f"CPU has no {name} for {dtype}")
    actual = OPS[name](a.to("tpu"), b.to("tpu"))
    exp_list = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    act_list = list(actual) if isinstance(actual, (tuple, list)) else [actual]
    assert len(exp_list) == len(act_list)
    for e, t in zip(exp_list, act_list, strict=True):
        _same(e, t)


SCALED_OUT = (None, torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)


@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("out_dtype", SCALED_OUT, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("scales", ["tensorwise", "rowwise"])
def test_scaled_mm_equals_cpu(scales: str, out_dtype: torch.dtype | None, bias: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    m, k, n = 16, 64, 24
    a = (torch.randn(m, k, generator=gen) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, generator=gen) * 4).to(torch.float8_e5m2).t()  # column-major, as CUDA requires
    if scales == "tensorwise":
        sa, sb = torch.tensor(0.37), torch.tensor(1.3)
    else:
        sa, sb = torch.rand(m, 1, generator=gen) + 0.5, torch.rand(1, n, generator=gen) + 0.5
    kwargs = {"out_dtype": out_dtype, "bias": torch.randn(n, generator=gen).bfloat16() if bias else None}
    try:
        with cpu_reference():
            expected = torch._scaled_mm(a, b, sa, sb, **kwargs)
    except RuntimeError:
        pytest.skip("CPU rejects this combination")
    tpu = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    _same(expected, torch._scaled_mm(a.to("tpu"), b.to("tpu"), sa.to("tpu"), sb.to("tpu"), **tpu))


def test_scaled_mm_scale_result_and_bad_input() -> None:
    a = torch.randn(8, 32).to(torch.float8_e4m3fn)
    b = torch.randn(16, 32).to(torch.float8_e4m3fn).t()
    sa, sb, sr = torch.tensor(0.5), torch.tensor(2.0), torch.tensor(4.0)
    with cpu_reference():
        expected = torch._scaled_mm(a, b, sa, sb, scale_result=sr, out_dtype=torch.float8_e4m3fn)
    t = [v.to("tpu") for v in (a, b, sa, sb, sr)]
    _same(expected, torch._scaled_mm(*t[:4], scale_result=t[4], out_dtype=torch.float8_e4m3fn))
    with pytest.raises(RuntimeError, match="Expected mat1 to be Float8"):
        torch._scaled_mm(t[0].float(), t[1], t[2], t[3])
