"""torch.linalg.cholesky_ex's `info` on tpu, against CPU: Transformers' resize_token_embeddings checks it
(constraints.positive_definite) to choose between sampling new rows and using the mean."""

from __future__ import annotations

import torch
from torch.distributions import constraints

import hf_tpu  # noqa: F401


def _matrices() -> list[torch.Tensor]:
    torch.manual_seed(0)
    w = torch.randn(4, 8)
    c = w - w.mean(0)
    rank_deficient = c.T @ c / 4  # rank 3 of 8, as a 4-token vocabulary with hidden size 8
    b = torch.randn(8, 8)
    pd = b @ b.T + 8 * torch.eye(8)
    indefinite = pd.clone()
    indefinite[2, 2] = -50.0  # the 3rd leading minor is the first that fails
    return [pd, rank_deficient, indefinite, torch.stack([pd, indefinite])]


def test_cholesky_ex_info_and_factor_match_cpu() -> None:
    for m in _matrices():
        for upper in (False, True):
            want = torch.linalg.cholesky_ex(m, upper=upper)
            got = torch.linalg.cholesky_ex(m.to("tpu"), upper=upper)
            assert got.info.dtype == torch.int32
            ok = want.info.cpu() == 0
            # info agrees on success/failure; the failing minor is exact away from rounding (not rank_deficient)
            torch.testing.assert_close(got.info.cpu() == 0, ok)
            if m is not _matrices()[1]:
                torch.testing.assert_close(got.info.cpu(), want.info)
            if ok.all():
                torch.testing.assert_close(got.L.cpu(), want.L, rtol=1e-4, atol=1e-5)


def test_positive_definite_constraint_matches_cpu() -> None:
    for m in _matrices():
        assert bool(constraints.positive_definite.check(1e-9 * m.to("tpu")).all()) == bool(
            constraints.positive_definite.check(1e-9 * m).all())
