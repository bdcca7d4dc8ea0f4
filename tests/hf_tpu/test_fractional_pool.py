"""fractional_max_pool2d/3d on tpu (hf_tpu/fractional_pool.py) given CPU's random samples: CPU's values and
indices exactly, in float32 and the half types, batched and not, and CPU's gradients. (The OpInfo parity run
skips these ops: without _random_samples they draw them on the device, from a different generator than CPU's.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

CASES = [(2, (2, 3, 9, 8), (2, 3), (4, 3)), (2, (3, 7, 7), (3, 3), (3, 2)), (3, (1, 2, 6, 7, 5), (2, 2, 3), (3, 2, 2))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("nd,shape,kernel,out", CASES, ids=lambda v: str(v))
def test_matches_cpu_given_the_samples(nd: int, shape: tuple, kernel: tuple, out: tuple, dtype: torch.dtype) -> None:
    if nd == 3 and dtype == torch.float16:
        pytest.skip("CPU has no float16 fractional_max_pool3d")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen).to(dtype).requires_grad_()
    n = shape[0] if len(shape) == nd + 2 else 1
    u = torch.rand(n, shape[-nd - 1], nd, generator=gen).to(dtype)
    f = F.fractional_max_pool2d if nd == 2 else F.fractional_max_pool3d
    e, ei = f(x, kernel, output_size=out, return_indices=True, _random_samples=u)
    t = x.detach().to("tpu").requires_grad_()
    a, ai = f(t, kernel, output_size=out, return_indices=True, _random_samples=u.to("tpu"))
    assert torch.equal(e, a.cpu()) and torch.equal(ei, ai.cpu())
    w = torch.linspace(0.5, 1.5, e.numel()).reshape(e.shape).to(dtype)
    (g,) = torch.autograd.grad((e * w).sum(), x)
    (tg,) = torch.autograd.grad((a * w.to("tpu")).sum(), t)
    torch.testing.assert_close(tg.cpu(), g)
