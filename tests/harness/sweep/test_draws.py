"""Shared randomness (issue 32): draws made in a forward come from one seeded CPU stream on every device."""

import torch

from harness.sweep.draws import shared_draws


class Draws(torch.nn.Module):
    """Draws in its forward as Reformer, VITS and Hiera do: on the input's device, in its dtype."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(8))  # no matmul: the tpu's matmul precision is not the subject

    def forward(self, x):
        noise = torch.randn(x.shape, device=x.device, dtype=x.dtype)
        perm = torch.randperm(x.shape[-1], device=x.device)
        y = (self.scale * (x + noise + torch.empty_like(x).uniform_(-1, 1)))[..., perm]
        return {"logits": y * torch.bernoulli(torch.full_like(x, 0.5))}


def _run(model, x, compiled=False):
    fn = torch.compile(model, backend="tpu") if compiled else model
    with torch.no_grad(), shared_draws(0) as d:
        out = fn(x)["logits"].cpu()
    return out, d.summary()


def test_forward_draws_match_across_devices_eager_and_compiled():
    torch.manual_seed(0)
    model, x = Draws().eval(), torch.randn(3, 8)
    ref, drew = _run(model, x)
    assert drew == "bernoulli:1;randn:1;randperm:1;uniform_:1"
    fp64, _ = _run(model.double(), x.double())
    model.float()
    eager, _ = _run(model.to("tpu"), x.to("tpu"))
    torch._dynamo.reset()
    compiled, drew_c = _run(model, x.to("tpu"), compiled=True)
    assert drew_c == drew
    torch.testing.assert_close(eager, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fp64.float(), ref, rtol=1e-5, atol=1e-6)  # float32 draws cast to float64
    torch.manual_seed(1)  # without the block the draws follow the global generator
    assert not torch.allclose(model.to("cpu")(x)["logits"].detach(), ref)  # the block really replaced the draws


def test_runner_row_records_the_draws_and_passes():
    from harness.sweep.device import get_device
    from harness.sweep.options import SweepOptions
    from harness.sweep.runner import run_entry
    from harness.zoo.entry import BuiltEntry

    class Entry:
        id, library, model_type, model_class, task = "test/draws", "test", "t", "Draws", "t"

        def build(self, seed=0):
            torch.manual_seed(seed)
            return BuiltEntry(model=Draws().eval(), inputs={"x": torch.randn(3, 8)})

    opts = SweepOptions(zoo="test", device="tpu", out="/tmp/unused-draws-run", run_id="t", timeout=60,
                        progress="none", repeats=1)
    events = []
    run_entry(Entry(), ("eager", "compiled"), opts, get_device("tpu"), lambda k, p: events.append((k, p)))
    rows = {p["mode"]: p for k, p in events if k == "row"}
    for mode in ("eager", "compiled"):
        assert rows[mode]["status"] == "pass", rows[mode].get("error_message")
        assert rows[mode]["reference"] == "valid" and rows[mode]["drew"].startswith("bernoulli:1")
        assert not rows[mode].get("nondeterministic")
