"""Backward kernels PyTorch leaves to PrivateUse1 (backward_lowerings.py): gradients on tpu match CPU's, and a
small CNN trains in eager mode on tpu as on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

IDX = torch.tensor([0, 2, 1, 3, 4, 1])
OFFS = torch.tensor([0, 2, 5])

CASES = {
    "conv1d_groups_dilation": (lambda x, w: F.conv1d(x, w, padding=1, dilation=2, groups=2), (2, 4, 8), (4, 2, 3)),
    "conv2d_bias": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), (2, 3, 7, 7), (4, 3, 3, 3), (4,)),
    "conv3d": (lambda x, w: F.conv3d(x, w, stride=2), (1, 2, 5, 5, 5), (3, 2, 3, 3, 3)),
    "conv_transpose1d_groups": (lambda x, w: F.conv_transpose1d(x, w, stride=2, output_padding=1, groups=2),
                                (2, 4, 5), (4, 3, 3)),
    "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1), (2, 3, 5, 5), (3, 4, 3, 3)),
    "conv_transpose3d": (lambda x, w: F.conv_transpose3d(x, w, stride=2, padding=1), (1, 2, 3, 3, 3),
                         (2, 3, 3, 3, 3)),
    "avg_pool1d": (lambda x: F.avg_pool1d(x, 3, stride=2, padding=1), (2, 3, 9)),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False), (2, 3, 7, 7)),
    "avg_pool3d": (lambda x: F.avg_pool3d(x, 2), (1, 2, 4, 4, 4)),
    "adaptive_avg_pool1d": (lambda x: F.adaptive_avg_pool1d(x, 3), (2, 3, 8)),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, 3), (2, 3, 8, 8)),
    "adaptive_avg_pool3d": (lambda x: F.adaptive_avg_pool3d(x, 2), (1, 2, 5, 5, 5)),
    "max_pool1d": (lambda x: F.max_pool1d(x, 3, stride=2, padding=1), (2, 3, 9)),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), (2, 3, 8, 8)),
    "max_pool3d": (lambda x: F.max_pool3d(x, 2), (1, 2, 4, 4, 4)),
    "nearest": (lambda x: F.interpolate(x, scale_factor=2), (2, 3, 4, 4)),
    "nearest_exact": (lambda x: F.interpolate(x, size=(5, 7), mode="nearest-exact"), (1, 2, 3, 3)),
    "nearest3d": (lambda x: F.interpolate(x, scale_factor=2), (1, 2, 2, 3, 2)),
    "linear": (lambda x: F.interpolate(x, scale_factor=2, mode="linear"), (1, 2, 3)),
    "bilinear": (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), (2, 3, 4, 4)),
    "bicubic": (lambda x: F.interpolate(x, size=(7, 5), mode="bicubic", align_corners=True), (2, 3, 4, 4)),
    "trilinear": (lambda x: F.interpolate(x, scale_factor=2, mode="trilinear"), (1, 2, 3, 3, 3)),
    "bilinear_aa": (lambda x: F.interpolate(x, size=(2, 2), mode="bilinear", antialias=True), (1, 2, 5, 5)),
    "grid_sample": (lambda x, g: F.grid_sample(x, g, align_corners=False), (1, 2, 4, 4), (1, 3, 3, 2)),
    "pad_replicate": (lambda x: F.pad(x, (1, 2, 1, 1), mode="replicate"), (1, 2, 4, 4)),
    "pad_reflect1d": (lambda x: F.pad(x, (1, 1), mode="reflect"), (1, 2, 4)),
    "cdist": (lambda x, y: torch.cdist(x, y), (3, 4), (5, 4)),
    "pdist": (lambda x: F.pdist(x), (5, 4)),
    "local_response_norm": (lambda x: F.local_response_norm(x, 2), (2, 4, 5, 5)),
    "embedding_bag_sum": (lambda w: F.embedding_bag(IDX.to(w.device), w, OFFS.to(w.device), mode="sum"), (5, 3)),
    "embedding_bag_mean": (lambda w: F.embedding_bag(IDX.to(w.device), w, OFFS.to(w.device), mode="mean"), (5, 3)),
    "embedding_bag_max": (lambda w: F.embedding_bag(IDX.to(w.device), w, OFFS.to(w.device), mode="max"), (5, 3)),
    "embedding_bag_weights": (lambda w, p: F.embedding_bag(IDX.to(w.device), w, OFFS.to(w.device),
                                                           per_sample_weights=p, mode="sum"), (5, 3), (6,)),
}


@pytest.mark.usefixtures("highest")
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_match_cpu(name: str) -> None:
    fn, *shapes = CASES[name]
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(*s, generator=gen, requires_grad=True) for s in shapes]
    ts = [x.detach().to("tpu").requires_grad_() for x in xs]
    out, t_out = fn(*xs), fn(*ts)
    torch.testing.assert_close(t_out.cpu(), out, rtol=1e-4, atol=1e-4)
    cot = torch.randn(out.shape, generator=gen)
    out.backward(cot)
    t_out.backward(cot.to("tpu"))
    for x, t in zip(xs, ts, strict=True):
        torch.testing.assert_close(t.grad.cpu(), x.grad, rtol=1e-4, atol=1e-4)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.ConvTranspose2d(8, 4, 3, padding=1, groups=2)
        self.head = torch.nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv1(x)))
        h = F.max_pool2d(h, 2)
        h = F.avg_pool2d(self.conv2(h), 1)
        h = F.interpolate(h, scale_factor=2, mode="bilinear")
        return self.head(h)


@pytest.mark.usefixtures("highest")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_small_cnn_trains_like_cpu(compiled: bool) -> None:
    """Compiled graphs hold aten.convolution_backward (AOTAutograd's form), which had no lowering either."""
    torch.manual_seed(0)
    cpu = _Net()
    tpu = _Net()
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    run = torch.compile(tpu, backend="tpu") if compiled else tpu
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.1)
    opt_t = torch.optim.SGD(tpu.parameters(), lr=0.1)
    x, y = torch.randn(4, 3, 8, 8), torch.randn(4, 2, 8, 8)
    for _ in range(3):
        for model, opt, dev in ((cpu, opt_c, "cpu"), (run, opt_t, "tpu")):
            opt.zero_grad()
            F.mse_loss(model(x.to(dev)), y.to(dev)).backward()
            opt.step()
    for p, q in zip(cpu.parameters(), tpu.parameters(), strict=True):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-4)
    # native_batch_norm writes the running statistics in place though its schema does not say so
    torch.testing.assert_close(tpu.bn.running_mean.cpu(), cpu.bn.running_mean, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(tpu.bn.running_var.cpu(), cpu.bn.running_var, rtol=1e-4, atol=1e-4)
    tpu.eval()
    cpu.eval()
    torch.testing.assert_close(tpu(x.to("tpu")).cpu(), cpu(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_masked_scatter_source_gradient_matches_cpu(compiled: bool) -> None:
    """A VLM's merge of image features into text embeddings (`masked_scatter` with a broadcast mask and a
    source larger than the masked count), trained through: the source's gradient is CPU's. Compiled, this
    needs aten.masked_scatter_backward's lowering (the full zoo's train run: 16 compiled VLM rows failed)."""
    torch.manual_seed(0)
    emb, feats = torch.randn(2, 6, 4), torch.randn(7, 4)
    mask = torch.tensor([[0, 1, 1, 0, 0, 1], [1, 0, 0, 1, 0, 0]], dtype=torch.bool)[..., None]

    def f(e: torch.Tensor, s: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return (e.masked_scatter(m, s) * torch.arange(4.0, device=e.device)).sum()

    grads = {}
    for dev in ("cpu", "tpu"):
        e = emb.to(dev).detach().requires_grad_()
        s = feats.to(dev).detach().requires_grad_()
        fn = torch.compile(f, backend="tpu", fullgraph=True) if compiled and dev == "tpu" else f
        fn(e, s, mask.to(dev)).backward()
        grads[dev] = (e.grad.cpu(), s.grad.cpu())
    for cpu, tpu in zip(grads["cpu"], grads["tpu"], strict=True):
        torch.testing.assert_close(tpu, cpu, rtol=0, atol=0)
