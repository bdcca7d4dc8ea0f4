"""torch.special's orthogonal polynomials lowered by hf_tpu/special_polynomials.py give CPU's values on tpu over
every branch of CPU's kernel: n < 0, n = 0 and 1, the recurrence, the trigonometric form for large n, and the
end points of the interval; x as a tensor or a scalar, n as a tensor or a scalar."""

from __future__ import annotations

import op_parity
import pytest
import torch

NAMES = ["chebyshev_polynomial_v", "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
         "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w",
         "legendre_polynomial_p"]
X = torch.tensor([-1.0, -0.7, -0.25, 0.0, 0.3, 0.5, 0.75, 0.9, 1.0])


@pytest.mark.usefixtures("highest")
@pytest.mark.parametrize("name", NAMES)
def test_every_branch_matches_cpu(name: str) -> None:
    fn = getattr(torch.special, name)
    n = torch.arange(-1, 13, dtype=torch.float32)[:, None]  # up to 12: past every trigonometric cut-off
    x = X[None, :].expand(n.shape[0], -1)
    op_parity.compare(fn(x, n), fn(x.to("tpu"), n.to("tpu")))
    op_parity.compare(fn(x, 5), fn(x.to("tpu"), 5))
    op_parity.compare(fn(0.3, n), fn(0.3, n.to("tpu")))
    op_parity.compare(fn(x.to(torch.int64), n), fn(x.to(torch.int64).to("tpu"), n.to("tpu")))
