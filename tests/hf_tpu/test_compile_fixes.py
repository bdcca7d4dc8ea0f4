"""Regression tests for compiled-mode failures found by the zoo sweep (issue 13), each from a minimal repro
that `hf-tpu diagnose ENTRY --mode compiled` wrote. CPU PyTorch is the oracle."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo


def _compiled_vs_cpu(module: torch.nn.Module, *inputs: torch.Tensor, atol: float = 1e-4) -> None:
    torch._dynamo.reset()
    module = module.eval()
    with torch.no_grad():
        want = module(*inputs)
        dev = torch.compile(module.to("tpu"), backend="tpu")
        got = dev(*(x.to("tpu") for x in inputs))
    module.to("cpu")
    torch.testing.assert_close(got.cpu(), want, atol=atol, rtol=1e-4)


def test_convolution_padding_given_as_one_element_list(highest) -> None:
    # Siglip/Align/PaliGemma patch embeddings: Conv2d(padding="valid") reaches aten.convolution with padding
    # [0]; torchax's lowering extends that list in place, which FX's immutable_list refused.
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, kernel_size=4, stride=4, padding="valid")
    _compiled_vs_cpu(conv, torch.randn(2, 3, 16, 16))


def test_graph_without_tpu_inputs_returns_tpu_tensors() -> None:
    # Qwen2-VL's vision position ids: after a graph break on grid_thw.tolist(), a graph builds tpu tensors from
    # Python ints only; its outputs came back on CPU and the next graph saw CPU and tpu tensors mixed
    # ("Tensor device mismatch" during Dynamo's fake-tensor propagation).
    torch._dynamo.reset()

    def positions(h: int, w: int) -> torch.Tensor:
        a, b = torch.meshgrid(torch.arange(h, device="tpu"), torch.arange(w, device="tpu"), indexing="ij")
        return torch.stack([a.flatten(), b.flatten()], dim=-1)

    got = torch.compile(positions, backend="tpu")(3, 4)
    assert got.device.type == "tpu"
    want = torch.stack([t.flatten() for t in torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij")], -1)
    torch.testing.assert_close(got.cpu(), want)
    # and a graph that makes a CPU tensor still returns it on CPU
    cpu_out = torch.compile(lambda x: (x + 1, torch.arange(3)), backend="tpu")(torch.ones(2, device="tpu"))
    assert cpu_out[0].device.type == "tpu" and cpu_out[1].device.type == "cpu"


class _Pool(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # FocalNet/DonutSwin pooling: adaptive_avg_pool1d of a transposed (channels-last-looking) tensor makes
        # PyTorch's kernel call as_strided_ on its output; under AOTAutograd that lands on FunctionalTensor's
        # data-less wrapper ("this tpu tensor has no data attached")
        return torch.nn.functional.adaptive_avg_pool1d(x.transpose(1, 2), 1).flatten(1)


def test_inplace_view_on_functional_wrapper_updates_metadata_only(highest) -> None:
    torch.manual_seed(0)
    _compiled_vs_cpu(_Pool(), torch.randn(2, 9, 16))



def _grouped(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.grouped_mm(a, b, offs=offs)


def test_grouped_mm_float32_compiles_and_matches_cpu(highest) -> None:
    # Transformers' MoE experts (OLMoE, ExaoneMoe, Mistral4, MiMo-V2-Flash) call grouped_mm on tpu in float32;
    # PyTorch's meta kernel allows bfloat16 only ("RuntimeError when making fake tensor call"), and the
    # compiled graph needs a lowering (jax.lax.ragged_dot)
    torch.manual_seed(0)
    offs = torch.tensor([3, 3, 7, 10], dtype=torch.int32)  # an empty group and a tail row past offs[-1]
    cases = {
        "2d x 3d": (torch.randn(12, 16), torch.randn(4, 16, 8), offs),
        "3d x 3d": (torch.randn(4, 6, 16), torch.randn(4, 16, 8), None),
        "2d x 2d": (torch.randn(8, 12), torch.randn(12, 8), offs),
        "3d x 2d": (torch.randn(4, 8, 16), torch.randn(16, 12), offs),
    }
    for name, (a, b, o) in cases.items():
        torch._dynamo.reset()
        want = _grouped(a, b, o)
        got = torch.compile(_grouped, backend="tpu")(a.to("tpu"), b.to("tpu"), None if o is None else o.to("tpu"))
        if name == "2d x 3d":  # rows past offs[-1] are unspecified in PyTorch; ours are zero
            want, got = want[:10], got[:10]
        elif name == "3d x 2d":
            want, got = want[:, :10], got[:, :10]
        torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def test_antialiased_resize_matches_cpu_eager_and_compiled(highest) -> None:
    # Cosmos3-Edge: torchax's _upsample_bilinear2d_aa called a JAX internal that changed ("'tuple' object is
    # not callable"), in both modes
    torch.manual_seed(0)
    x = torch.randn(2, 3, 17, 23)
    for mode in ("bilinear", "bicubic"):
        for size in ((8, 9), (30, 40)):
            def resize(t: torch.Tensor, mode: str = mode, size: tuple = size) -> torch.Tensor:
                return torch.nn.functional.interpolate(t, size=size, mode=mode, antialias=True)

            want = resize(x)
            torch.testing.assert_close(resize(x.to("tpu")).cpu(), want, atol=1e-4, rtol=1e-4)
            torch._dynamo.reset()
            got = torch.compile(resize, backend="tpu")(x.to("tpu"))
            torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)


def test_assert_async_in_a_compiled_graph() -> None:
    # Gemma4 vision: torch._assert_async in the graph had no lowering ("no JAX lowering for aten::_assert_async.msg")
    torch._dynamo.reset()

    def checked(x: torch.Tensor) -> torch.Tensor:
        torch._assert_async((x.sum() > -1e9), "sum is finite")
        return x * 2

    x = torch.randn(3, 4)
    got = torch.compile(checked, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), x * 2)


# Flaubert's forward: `assert lengths.max().item() <= slen`. Built from source: pytest rewrites the asserts of
# test modules into code Dynamo splits at, and the model's own plain `assert` is what is tested.
_namespace: dict = {"torch": torch, "__name__": __name__}  # pickled by reference to this module
exec(compile("""
class _AssertOnItem(torch.nn.Module):
    def forward(self, x, lengths):
        assert lengths.max().item() <= x.shape[1]
        return x * 2 + lengths.max()
""", "flaubert_like", "exec"), _namespace)
_AssertOnItem = _namespace["_AssertOnItem"]


class _ReturnsItem(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x * 2, x.argmax().item()


def _graph_cache_on(monkeypatch, tmp_path) -> None:
    # the graph cache's full-graph capture keeps `.item()` in the graph (ordinary Dynamo splits there)
    monkeypatch.setenv("HF_TPU_COMPILE_CACHE", "1")
    monkeypatch.setenv("HF_TPU_GRAPH_CACHE_DIR", str(tmp_path / "graphs"))
    monkeypatch.delenv("HF_TPU_SHARED_CACHE_DIR", raising=False)


@pytest.mark.parametrize("cache", [False, True])
def test_item_feeding_an_assert_compiles(highest, monkeypatch, tmp_path, cache: bool) -> None:
    if cache:
        _graph_cache_on(monkeypatch, tmp_path)
    from hf_tpu import compile_cache

    x, lengths = torch.randn(2, 5), torch.tensor([3, 5])
    want = _AssertOnItem()(x, lengths)
    torch._dynamo.reset()
    compile_cache.reset_stats()
    got = torch.compile(_AssertOnItem(), backend="tpu")(x.to("tpu"), lengths.to("tpu"))
    torch.testing.assert_close(got.cpu(), want)
    if cache:  # the saved graph itself ran (no detour through the ordinary path)
        assert compile_cache.stats()["saved"] == 1 and compile_cache.stats()["unsaveable"] == 0


def test_item_returned_by_a_graph_is_a_python_number(highest, monkeypatch, tmp_path) -> None:
    _graph_cache_on(monkeypatch, tmp_path)
    from hf_tpu import compile_cache

    x = torch.tensor([[0.5, 3.0, -1.0]])
    torch._dynamo.reset()
    compile_cache.reset_stats()
    y, i = torch.compile(_ReturnsItem(), backend="tpu")(x.to("tpu"))
    assert type(i) is int and i == 1
    torch.testing.assert_close(y.cpu(), x * 2)
    assert compile_cache.stats()["unsaveable"] == 0


def test_saved_graph_that_cannot_be_lowered_takes_the_ordinary_path(highest, monkeypatch, tmp_path) -> None:
    # a value the full-graph capture kept in its graph that XLA cannot trace: the first call goes the ordinary
    # torch.compile way (which splits the graph there) instead of failing, and later calls go there directly
    from hf_tpu import compile_cache, op_registry

    _graph_cache_on(monkeypatch, tmp_path)
    monkeypatch.setitem(op_registry.table("graph"), torch.ops.aten._local_scalar_dense.default, lambda x: int(x))
    x, lengths = torch.randn(2, 5), torch.tensor([3, 5])
    want = _AssertOnItem()(x, lengths)
    torch._dynamo.reset()
    compile_cache.reset_stats()
    fn = torch.compile(_AssertOnItem(), backend="tpu")
    for _ in range(2):
        torch.testing.assert_close(fn(x.to("tpu"), lengths.to("tpu")).cpu(), want)
    assert compile_cache.stats()["unsaveable"] == 1


def _strided_of_transpose(a: torch.Tensor) -> torch.Tensor:
    return a.transpose(0, 1).as_strided((3, 4), (1, 2), 1) * 1.0


def _overlapping_chunks_of_permute(a: torch.Tensor) -> torch.Tensor:
    # Longformer's _chunk: overlapping windows (as_strided) of a permuted tensor
    return a.permute(1, 0, 2).as_strided((2, 3, 4, 3), (3, 12, 6, 1)) + 0


def _strided_of_offset_view(a: torch.Tensor) -> torch.Tensor:
    return a[1:].as_strided((2, 3), (1, 3), 5) * 1.0  # an absolute storage offset, past the view's own


def _strided_of_offset_view_at_its_own_offset(a: torch.Tensor) -> torch.Tensor:
    # no offset given: PyTorch starts at the input's own (a[1:]'s, 6), not its storage's first element (a read
    # 0.. of `a` before)
    return a[1:].as_strided((2, 3), (1, 3)) * 1.0


@pytest.mark.parametrize("fn, shape", [(_strided_of_transpose, (6, 4)), (_overlapping_chunks_of_permute, (8, 2, 3)),
                                       (_strided_of_offset_view, (4, 6)),
                                       (_strided_of_offset_view_at_its_own_offset, (4, 6))])
def test_as_strided_reads_its_input_storage_as_laid_out(fn, shape) -> None:
    # LongformerForMultipleChoice compiled: as_strided of a non-contiguous graph value read the logical
    # (row-major) array as if it were the storage, so the windows held other elements (rel rmse 1.6e-4)
    a = torch.randn(shape)
    want = fn(a)
    torch._dynamo.reset()
    got = torch.compile(fn, backend="tpu")(a.to("tpu"))
    torch.testing.assert_close(got.cpu(), want, atol=0, rtol=0)


def _embed_at_mask(emb: torch.Tensor, img: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    x = emb * 1.5
    x[mask] = img.view(-1, img.size(-1))  # Kosmos-2's forward_embedding
    return x


def _embed_at_columns(emb: torch.Tensor, img: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    x = emb * 1.5
    x[:, mask] = img  # a mask over a later dimension: its rows sit in the middle of the result
    return x


@pytest.mark.parametrize("fn,emb_shape,img_shape,mask", [
    (_embed_at_mask, (2, 5, 4), (2, 2, 4), [[0, 1, 1, 0, 0], [1, 0, 0, 1, 0]]),
    (_embed_at_columns, (3, 6, 2), (3, 2, 2), [0, 1, 0, 0, 1, 0]),
])
def test_boolean_mask_setitem_trains_compiled(highest, monkeypatch, tmp_path, fn, emb_shape, img_shape, mask) -> None:
    # Kosmos2Model's compiled train row: the graph cache's full-graph capture keeps the setitem in one graph
    # (ordinary Dynamo gives up on it and runs it eagerly); its backward reads grad[mask] with the mask traced,
    # which JAX refused ("Array boolean indices must be concrete") at the first backward, past any fallback.
    _graph_cache_on(monkeypatch, tmp_path)
    from hf_tpu import compile_cache

    torch._dynamo.reset()
    compile_cache.reset_stats()
    torch.manual_seed(0)
    emb, img = torch.randn(emb_shape), torch.randn(img_shape)
    mask_t = torch.tensor(mask, dtype=torch.bool)
    w = torch.randn(emb_shape)
    got = {}
    for dev in ("cpu", "tpu"):
        e, i = emb.to(dev, copy=True).requires_grad_(), img.to(dev, copy=True).requires_grad_()
        run = torch.compile(fn, backend="tpu") if dev == "tpu" else fn
        out = run(e, i, mask_t.to(dev))
        (out * w.to(dev)).sum().backward()
        got[dev] = [out.detach().cpu(), e.grad.cpu(), i.grad.cpu()]
    for g, want in zip(got["tpu"], got["cpu"], strict=True):
        torch.testing.assert_close(g, want)
    assert compile_cache.stats()["saved"] == 1  # the one graph ran, forward and backward


@pytest.mark.parametrize("graph_cache", [False, True], ids=["tpu backend", "graph cache's backend"])
def test_output_aliasing_a_matmul_result_is_rebuilt_from_its_sizes(highest, monkeypatch, graph_cache: bool) -> None:
    # Step3p7Model's compiled training step: outputs that are views of a 3-d matmul's result (mm, then
    # _unsafe_view) are rebuilt by AOTAutograd at run time. PyTorch 2.13's _unsafe_view ViewMeta keeps its
    # sizes as a dangling reference, and replaying it made tpu's view read garbage ("shape '[94059980854764,
    # 7647175993348940116, 64]' is invalid"); whether the freed memory is reused yet is luck, so the test
    # checks that no such replay runs at all, and that the outputs and their gradients are CPU's.
    from torch._functorch._aot_autograd import functional_utils

    replayed: list[str] = []
    replay = functional_utils._functionalization.apply_view_meta_sequence

    def spy(base, seq):
        replayed.extend(type(vm).__name__ for vm in seq)
        return replay(base, seq)

    monkeypatch.setattr(functional_utils._functionalization, "apply_view_meta_sequence", spy)

    def f(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
        z = torch.matmul(x, w)  # (2, 1, 64) @ (64, 64): mm then _unsafe_view
        return [z[i].view(-1, 64) for i in range(2)]

    torch.manual_seed(0)
    x, w = torch.randn(2, 1, 64), torch.randn(64, 64)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    want = f(xc, wc)
    sum(o.square().sum() for o in want).backward()
    torch._dynamo.reset()
    xt, wt = x.to("tpu").requires_grad_(), w.to("tpu").requires_grad_()
    from hf_tpu.compile_cache import serializable

    got = torch.compile(f, backend=serializable.serializable_backend if graph_cache else "tpu")(xt, wt)
    sum(o.square().sum() for o in got).backward()
    assert "_unsafe_view_ViewMeta" not in replayed
    for g, c in zip(got, want):
        torch.testing.assert_close(g.detach().cpu(), c.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(wt.grad.cpu(), wc.grad, rtol=1e-5, atol=1e-4)

