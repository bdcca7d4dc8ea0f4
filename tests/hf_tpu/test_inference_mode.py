"""torch.inference_mode() around tpu modules (issue 25): views of normal tensors stay normal tensors."""

import torch

import hf_tpu  # noqa: F401  (registers `tpu`)


def test_linear_under_inference_mode_matches_cpu(highest: None) -> None:
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.GELU(), torch.nn.Linear(4, 2))
    tpu = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.GELU(), torch.nn.Linear(4, 2))
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    x = torch.randn(5, 3)
    with torch.inference_mode():
        want = cpu(x)
        got = tpu(x.to("tpu"))
    assert got.is_inference()
    torch.testing.assert_close(got.cpu(), want)


def test_views_of_normal_tensors_under_inference_mode() -> None:
    w = torch.randn(3, 4).to("tpu")
    with torch.inference_mode():
        t = w.t()
        s = w[1:]
        r = w.reshape(12)
        parts = w.split(2, dim=1)
    # as on CPU: a view of a normal tensor is normal and shares its version counter
    for v in (t, s, r, *parts):
        assert not v.is_inference()
        assert v._version == w._version
    torch.testing.assert_close(t.cpu(), w.cpu().t())
    torch.testing.assert_close(parts[1].cpu(), w.cpu()[:, 2:])
    with torch.inference_mode():
        x = torch.ones(2, 2, device="tpu")
        assert x.is_inference() and x.t().is_inference()
