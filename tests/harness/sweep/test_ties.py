"""Ties in ranking selections (issue 32): another tie order is not a failure, a wrong value is."""

import torch

from harness.sweep import numerics
from harness.sweep.ties import TieWatch


def _select(scores, feats, k):
    idx = torch.topk(scores, k, dim=1).indices
    return torch.gather(feats, 1, idx[..., None].expand(-1, -1, feats.shape[-1]))


def test_tie_watch_records_near_tied_topk_only():
    feats = torch.randn(2, 10, 4)
    with TieWatch() as watch:
        _select(torch.tensor([[1.0, 1.0, 0.5, 0.2, 0, 0, 0, 0, 0, 0]] * 2), feats, 3)
    assert watch.sizes == {3} and watch.summary() == "topk(3):1"
    with TieWatch() as watch:
        _select(torch.arange(20.0).reshape(2, 10), feats, 3)
    assert watch.sizes == set() and watch.summary() == ""


def test_tie_order_is_not_a_failure_while_a_wrong_value_is():
    torch.manual_seed(0)
    ref = {"logits": torch.randn(2, 6, 5)}
    tol = numerics.tolerance_for("test/x", "highest", "float32")
    perm = torch.tensor([1, 0, 2, 3, 5, 4])  # tied queries selected in another order
    res = {"logits": ref["logits"][:, perm]}
    assert not numerics.compare_outputs(ref, res, None, tol).match  # raw order: a false alarm
    ok = numerics.compare_outputs(ref, res, None, tol, tie_sizes=frozenset({6}))
    assert ok.match and "tie order" in ok.notes
    wrong = {"logits": res["logits"].clone()}
    wrong["logits"][0, 2] *= 1.01  # a 1% error in one selected row
    bad = numerics.compare_outputs(ref, wrong, None, tol, tie_sizes=frozenset({6}))
    assert not bad.match and "tie order" in bad.reason
