"""Bounded dynamism (hf_tpu/bounded.py): TorchTPU-style scripts (mark_dynamic with bounds, the bucket
compile options) run unchanged, compile one program per bucket, and give CPU's results for every size."""

from __future__ import annotations

import pytest
import torch

from hf_tpu import bounded, bounded_plan
from hf_tpu import compile as C
from hf_tpu.precision import cpu_reference


class TinyDecoder(torch.nn.Module):
    """A causal self-attention block with a mask built from the sequence length, RMS-style norm, and a
    mean over the sequence: reductions and contractions over the dynamic dimension that padding must not
    reach."""

    def __init__(self, vocab: int = 50, d: int = 16) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.emb(ids)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        q, k, v = self.qkv(h).split(h.shape[-1], dim=-1)
        n = ids.shape[1]
        pos = torch.arange(n, device=ids.device)
        causal = pos[None, :] <= pos[:, None]
        scores = (q @ k.transpose(1, 2)).masked_fill(~causal, float("-inf"))
        h = torch.softmax(scores, dim=-1) @ v + h
        return self.out(h), h.mean(dim=1)


def _run(fn, model_cpu, lengths, mark, **compile_kw):
    """Per length: the compiled tpu outputs and CPU's, computed as a TorchTPU user would write the loop."""
    torch._dynamo.reset()  # Dynamo keys compiled graphs by code object: each run starts afresh
    torch.manual_seed(0)
    ids_all = torch.randint(0, 50, (2, max(lengths)))
    compiled = torch.compile(fn, backend="tpu", **compile_kw)
    C.reset_stats()
    for n in lengths:
        ids = ids_all[:, :n].to("tpu")
        if mark:
            mark(ids)
        with torch.no_grad():
            got = [t.cpu() for t in compiled(ids)]
        with torch.no_grad(), cpu_reference():
            want = model_cpu(ids_all[:, :n])
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    return C.stats()


def test_one_program_for_every_length_up_to_the_bound(highest) -> None:
    cpu = TinyDecoder().eval()
    tpu = TinyDecoder().eval()
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    lengths = [2, 7, 3, 13, 32, 19]
    st = _run(tpu, cpu, lengths, lambda t: torch._dynamo.mark_dynamic(t, 1, min=2, max=32))
    assert st["padded_graphs"] == 1 and st["compilations"] == 1, st
    # without mark_dynamic: static shapes, a program per length (what a server with variable lengths paid)
    st = _run(tpu, cpu, lengths, None)
    assert st["padded_graphs"] == 0 and st["compilations"] == len(lengths), st


@pytest.mark.slow
def test_bucket_options_control_the_programs(highest) -> None:
    cpu = TinyDecoder().eval()
    tpu = TinyDecoder().eval()
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    # buckets of 8 from the traced length 5: [2, 8], [9, 16], [17, 40] (the last extended to max)
    opts = {"num_dynamic_buckets": 3, "bucket_size": 8}
    st = _run(tpu, cpu, [5, 3, 8, 9, 16, 17, 40, 6], lambda t: torch._dynamo.mark_dynamic(t, 1, min=2, max=40),
              options=opts)
    assert st["compilations"] == 3, st
    assert bounded.make_buckets(["s"], {"s": (2, 40)}, {"s": 5}, 3, 8).uppers == [{"s": 8}, {"s": 16}, {"s": 40}]
    # unbounded: consecutive multiples from the traced size; sizes above the last make Dynamo recompile
    assert bounded.make_buckets(["s"], {"s": (2, None)}, {"s": 20}, 2, 16).uppers == [{"s": 32}, {"s": 48}]
    assert bounded.make_buckets(["s"], {"s": (2, 10)}, {"s": 4}, 8, 128).uppers == [{"s": 10}]


@pytest.mark.slow
def test_beyond_an_unbounded_bucket_recompiles_a_bounded_number_of_times(highest) -> None:
    cpu = TinyDecoder().eval()
    tpu = TinyDecoder().eval()
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    lengths = [3, 10, 16, 17, 30, 40, 5]
    st = _run(tpu, cpu, lengths, lambda t: torch._dynamo.mark_dynamic(t, 1), options={"bucket_size": 16})
    # [2, 16] from the first call; 17 is outside, so Dynamo recompiles with a bucket from 17: [2, 32];
    # 40 once more
    assert st["compilations"] == 3 and st["graphs"] == 3, st


def test_ops_masked_or_kept_static_stay_exact(highest) -> None:
    w = torch.randn(16, 4)

    def last_token(x):  # reads the last real position: a padded program would read padding there
        return x[:, -1] @ w.to(x.device)

    def scaled(x):  # the length used as a value: the real length, traced, goes into the program
        return (x * x.shape[1]).sum(1)

    def pooled(x):  # a mean over the dynamic dimension: masked and rescaled, one program
        return torch.softmax(x.mean(1) @ w.to(x.device), -1)

    def ranked(x):  # a sort along the dynamic dimension: padded positions sorted last, the real prefix sorted
        return x.sort(dim=1).values.cumsum(1) + x.argsort(dim=1)

    def counted(x):  # histc with a range over the dynamic dimension: padded positions not counted
        return torch.histc(x[..., 0], bins=5, min=-1, max=1)

    experts = torch.randn(4, 16, 8)

    def moe_dispatch(x):  # Transformers' grouped_mm experts: tokens merged with the batch, sorted by expert id,
        # gathered by the sort's indices // top-k, grouped matmuls, back to token order by the inverse permutation
        h = x.reshape(-1, 16)
        weights, ids = (h @ w.to(x.device)).softmax(-1).topk(2, dim=-1)
        ids_g, perm = torch.sort(ids.reshape(-1))
        rows = h[perm // 2]
        offs = torch.cumsum(torch.histc(ids_g.float(), bins=4, min=0, max=3), 0, dtype=torch.int32)
        out = torch._grouped_mm(rows, experts.to(x.device), offs=offs) * weights.reshape(-1)[perm].unsqueeze(-1)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.size(0), device=x.device)
        return out[inv].view(-1, 2, 8).sum(1).view(x.shape[0], x.shape[1], 8).softmax(1)

    def grouped_router(x):  # GLM-4-MoE's grouped top-k: the best groups' mask broadcast over their experts
        logits = x.reshape(-1, 16) @ w.to(x.device)
        groups = logits.view(-1, 2, 2).topk(1, dim=-1).values.sum(-1)
        mask = torch.zeros_like(groups).scatter(1, groups.topk(1, dim=-1).indices, 1.0)
        mask = mask.unsqueeze(-1).expand(-1, 2, 2).reshape(-1, 4)
        return logits.masked_fill(mask == 0, 0.0).reshape(x.shape[0], x.shape[1], 4).softmax(1)

    def merged_order(x):  # the sort's positions over tokens merged with the batch as values: static, exact
        ids = (x.reshape(-1, 16) @ w.to(x.device)).argmax(-1)
        return ids.sort().indices.float() * 2

    def windowed(x):  # a sliding window wider than the bound: x[:, -1023:] is all of x at every length
        return x[:, -1023:].sum(1) + x[:, -1023:, :1].mean(1)

    def stacked(x):  # a new dimension over tensors sharing the dynamic one, then a reduction over it
        return torch.stack([x, x * 2], dim=-1).sum(1)

    def rotary_complex(x):  # DeepSeek-V2's rotary embedding: polar angles, complex products, back to real
        freqs = torch.polar(torch.ones_like(x[..., :8]), x[..., :8])
        rot = torch.view_as_complex(x.reshape(*x.shape[:-1], 8, 2)) * freqs
        return torch.view_as_real(rot).flatten(-2).sum(1)

    def half_rotated(x):  # DeepSeek-V2's rotary halves written into a new head: slice_scatter on a static dim
        y = x.new_empty(x.shape)
        y[..., :8] = x[..., 8:] * 2
        y[..., 8:] = x[..., :8]
        return y.softmax(1).sum(1)

    def shifted(x):  # a write shifted along the dynamic dimension: no rule, static shapes
        y = x.new_zeros(x.shape[0], x.shape[1] + 3, x.shape[2])
        y[:, 3:] = x * 2
        return y.softmax(1).sum(1)

    def top_features(x):  # topk along a static dimension: each position keeps its own values
        return x.topk(3, dim=-1).values.sum(1)

    def router(x):  # a MoE router over tokens merged with the batch: softmax and topk over the experts
        probs = (x.reshape(-1, 16) @ w.to(x.device)).softmax(-1)
        top = probs.topk(2, dim=-1).values
        return (top / top.sum(-1, keepdim=True)).reshape(x.shape[0], x.shape[1], 2).amax(1)

    def tiled(x):  # repeat along the dynamic dimension: real rows at j and n + j, not a prefix of the padded rows
        return x.repeat(1, 2, 1) * 3

    def dense_router(x):  # Llama4's MoE: top-1 scores scattered over the experts, tokens repeated per expert
        h = x.reshape(-1, 16)
        logits = h @ w.to(x.device)
        v, i = logits.topk(1, dim=1)
        scores = torch.full_like(logits, float("-inf")).scatter(1, i, v).sigmoid()
        a, b = (h.repeat(4, 1) * scores.t().reshape(-1, 1)).view(4, -1, 16).split(8, -1)
        return (a * b.sigmoid()).sum(0).view(x.shape[0], x.shape[1], 8).mean(1)

    cases = ((tiled, True), (dense_router, True), (top_features, True), (router, True), (half_rotated, True), (shifted, False),
             (last_token, False), (scaled, True), (pooled, True), (ranked, True), (windowed, True),
             (counted, True), (moe_dispatch, True), (merged_order, False), (grouped_router, True),
             (stacked, True), (rotary_complex, True))
    wrong = []  # every case is checked, so a missing rule names each case it breaks
    for fn, padded in cases:
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="tpu")
        C.reset_stats()
        lengths = [4, 9, 6]
        for n in lengths:
            x = torch.randn(2, n, 16)
            xt = x.to("tpu")
            torch._dynamo.mark_dynamic(xt, 1, min=2, max=32)
            with cpu_reference():
                want = fn(x)
            got = compiled(xt).cpu()
            if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
                wrong.append((fn.__name__, n, "wrong output"))
        st = C.stats()
        if st["padded_graphs"] != int(padded) or st["compilations"] != (1 if padded else len(lengths)):
            wrong.append((fn.__name__, st["padded_graphs"], st["compilations"]))
    assert not wrong, wrong


def test_view_rule() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    s = env.create_unbacked_symint()
    with FakeTensorMode(shape_env=env):
        a = torch.empty(1, s, 12)
        assert bounded_plan.view_ok(a, torch.empty(s, 12))  # [1, s, 12] -> [s, 12]
        assert bounded_plan.view_ok(a, torch.empty(1, s, 3, 4))  # split the static inner dimension
        assert bounded_plan.view_ok(a, torch.empty(12 * s))  # s outermost of the merge
        b = torch.empty(2, s, 4)
        assert not bounded_plan.view_ok(b, torch.empty(2 * s, 4))  # batch 1's real positions would move
        assert not bounded_plan.view_ok(b, torch.empty(8 * s))


def test_training_with_marked_lengths_gives_cpu_gradients(highest) -> None:
    # the forward is padded (its outputs include activations saved for the backward, batch merged with the
    # sequence by a view: sliced factor by factor); gradients equal CPU's at every length
    cpu = TinyDecoder()
    tpu = TinyDecoder()
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    torch._dynamo.reset()
    compiled = torch.compile(tpu, backend="tpu")
    C.reset_stats()
    for n in (5, 9, 3):
        ids = torch.randint(0, 50, (2, n), generator=torch.Generator().manual_seed(n))
        x = ids.to("tpu")
        torch._dynamo.mark_dynamic(x, 1, min=2, max=32)
        logits, pooled = compiled(x)
        (logits.sum() + pooled.square().sum()).backward()
        with cpu_reference():
            logits, pooled = cpu(ids)
            (logits.sum() + pooled.square().sum()).backward()
        for (name, p), q in zip(tpu.named_parameters(), cpu.parameters(), strict=True):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-4, msg=name)
            p.grad = q.grad = None
    assert C.stats()["padded_graphs"] >= 1


def test_an_empty_slice_keeps_the_padded_length(highest) -> None:
    # GPT-NeoX-Japanese's rotary split: x[..., 16:] of a 16-wide head is empty; its traced shape holds the
    # symbolic length, whose hint must not become the program's length
    def rotary_split(x):
        return torch.cat([x[..., :16] * 2, x[..., 16:]], dim=-1)

    torch._dynamo.reset()
    compiled = torch.compile(rotary_split, backend="tpu")
    for n in (2, 5, 7):
        x = torch.randn(2, n, 16)
        xt = x.to("tpu")
        torch._dynamo.mark_dynamic(xt, 1, min=2, max=16)
        torch.testing.assert_close(compiled(xt).cpu(), rotary_split(x))


def test_a_program_that_specializes_the_marked_length_raises_as_dynamo_does_on_cpu() -> None:
    # Mamba-style chunking: the pad to a multiple of the chunk makes Dynamo guard the length modulo 4, which
    # violates the marked dimension's constraint. Dynamo raises that for every backend before any backend
    # compiles (TorchTPU 0.2.0's too), so `tpu` must raise the same error, not hide it
    def chunked(x):
        n = x.shape[1]
        y = torch.nn.functional.pad(x, (0, (4 - n % 4) % 4)).reshape(x.shape[0], -1, 4).cumsum(-1)
        return y.reshape(x.shape[0], -1)[:, :n]

    raised = {}
    for backend, device in (("eager", "cpu"), ("tpu", "tpu")):
        torch._dynamo.reset()
        compiled = torch.compile(chunked, backend=backend)
        x1 = torch.randn(2, 1)
        torch.testing.assert_close(compiled(x1.to(device)).cpu(), chunked(x1))
        x = torch.randn(2, 5).to(device)
        torch._dynamo.mark_dynamic(x, 1, min=2, max=64)
        with pytest.raises(Exception) as info:
            compiled(x)
        raised[backend] = (type(info.value).__name__, str(info.value).splitlines()[0])
    assert raised["tpu"] == raised["eager"], raised
    assert raised["tpu"][0] == "ConstraintViolationError" and "size()[1]" in raised["tpu"][1], raised


def test_a_length_passed_through_a_graph_break_does_not_pin_the_marked_dimension(highest) -> None:
    # XLM: the length crosses a graph break (`.item()`) as a constant, and the resumed frame slices the marked
    # ids by it, then embeds them. AOTAutograd's memory-format metadata of ids[:, -n:] (contiguous only when
    # the marked size is n) guarded the marked size to n: ConstraintViolationError at the first marked length
    # on `tpu` (and on CPU with backend="aot_eager"), none with backend="eager" (no AOTAutograd). Only the
    # first length: the next ones are test_an_int_crossing_a_graph_break_becomes_symbolic_in_a_bounded_frame
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 8)
    emb_tpu = torch.nn.Embedding(50, 8).to("tpu")
    emb_tpu.load_state_dict(emb.state_dict())

    def resumed(ids, table):
        n = ids.shape[1]
        torch._dynamo.graph_break()
        return table(ids[:, -n:])

    torch._dynamo.reset()
    compiled = torch.compile(resumed, backend="tpu")
    with torch.no_grad():
        for n in (2, 2):
            ids = torch.randint(0, 50, (2, n))
            x = ids.to("tpu")  # contiguous: strides (n, 1)
            torch._dynamo.mark_dynamic(x, 1, min=2, max=64)
            torch.testing.assert_close(compiled(x, emb_tpu).cpu(), resumed(ids, emb))


def _xlm_like(emb_tpu, emb, lengths, mark):
    def resumed(ids, table):
        n = ids.shape[1]
        torch._dynamo.graph_break()
        return table(ids[:, -n:])

    torch._dynamo.reset()
    compiled = torch.compile(resumed, backend="tpu")
    C.reset_stats()
    with torch.no_grad():
        for n in lengths:
            ids = torch.randint(0, 50, (2, n))
            x = ids.to("tpu")
            if mark:
                torch._dynamo.mark_dynamic(x, 1, min=2, max=64)
            torch.testing.assert_close(compiled(x, emb_tpu).cpu(), resumed(ids, emb))
    return C.stats()


def test_an_int_crossing_a_graph_break_becomes_symbolic_in_a_bounded_frame(highest) -> None:
    # XLM at its third length: the resumed frame recompiles with the new length as a constant, and the slice
    # guards `n <= size`, which breaks the marked minimum (ConstraintViolationError) unless the int becomes
    # symbolic, as CPU's automatic dynamic shapes make it. hf-tpu keeps them off for static-shape users and
    # turns them on in frames whose inputs carry bounds (bounded_frames.py)
    import torch._dynamo.config as dconfig

    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 8)
    emb_tpu = torch.nn.Embedding(50, 8).to("tpu")
    emb_tpu.load_state_dict(emb.state_dict())
    st = _xlm_like(emb_tpu, emb, (2, 3, 4, 5, 9), mark=True)
    assert st["padded_graphs"] >= 1, st
    assert dconfig.automatic_dynamic_shapes is False  # restored after the bounded frames
    # a static-shape user of the same code: automatic dynamic shapes stay off, one static program per length
    st = _xlm_like(emb_tpu, emb, (3, 4, 5), mark=False)
    assert st["padded_graphs"] == 0 and st["static_dynamic_graphs"] == 0, st
    assert st["compilations"] >= 3, st


def test_a_guard_on_a_size_the_graph_does_not_take_keeps_the_graph_padded(highest) -> None:
    # Xmod: after 20 graph breaks, a frame's shape env guarded Eq(s87, s28) where only s28 was the graph's;
    # checking that guard at the bucket bound raised TypeError (an undecidable relation), BackendCompilerFailed.
    # Here the Python comparison guards the two marked lengths equal and y never reaches the graph
    def f(x, y):
        if x.shape[1] == y.shape[1]:
            return torch.softmax(x, dim=1) * 2
        return x

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="tpu")
    C.reset_stats()
    for n in (3, 5, 9):
        x, y = torch.randn(2, n), torch.randn(2, n)
        xt, yt = x.to("tpu"), y.to("tpu")
        torch._dynamo.mark_dynamic(xt, 1, min=2, max=16)
        torch._dynamo.mark_dynamic(yt, 1, min=2, max=16)
        torch.testing.assert_close(compiled(xt, yt).cpu(), f(x, y))
    st = C.stats()
    assert st["padded_graphs"] == 1 and st["compilations"] == 1, st


def _benchmark():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bounded_dynamism.py"
    spec = importlib.util.spec_from_file_location("bounded_dynamism_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_summary_counts_an_error_as_the_models_only_when_cpu_eager_fails_alike() -> None:
    bench = _benchmark()
    cve = "ConstraintViolationError: Constraints violated (L['kwargs']['input_ids'].size()[1])! For more"
    same = {"status": "error", "error": cve, "error_at": 2}
    rows = [
        {"id": "a", "status": "correct", "compilations": 2, "padded_graphs": 2},
        {"id": "spec", **same, "cpu_eager": {"status": "error", "error": cve, "error_at": 2}},
        {"id": "ours", **same, "cpu_eager": {"status": "ran", "lengths": 2}},
        {"id": "elsewhere", **same, "cpu_eager": {"status": "error", "error": cve, "error_at": 3}},
        {"id": "other_class", **same, "cpu_eager": {"status": "error", "error": "NameError: x", "error_at": 2}},
        {"id": "old_row", **same},
    ]
    kinds = {r["id"]: bench.error_kind(r) for r in rows[1:]}
    assert kinds == {"spec": "model", "ours": "hf-tpu", "elsewhere": "unchecked", "other_class": "unchecked",
                     "old_row": "unchecked"}
    text = bench.summary(rows)
    assert "errors: 1 the model's own" in text and "1 hf-tpu's" in text and "3 not checked" in text, text
    assert "1 model specializes the length (same on CPU with backend=eager)" in text, text
    assert "  spec: error (model's own) at length 2" in text and "  ours: error (hf-tpu)" in text, text
    # 6 built, 1 the model's own error: the share among the other 5
    assert "20.0% of the 5 built models whose CPU backend=eager run does not fail" in text, text
