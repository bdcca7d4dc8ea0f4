"""Run by tests/hf_tpu/test_graph_cache.py in a fresh process: compile a model with backend="tpu", print one
JSON line (outputs vs CPU, Dynamo traces, cache stats). Options come from the environment (CHILD_*)."""

import json
import os
import sys
import warnings

import torch

import hf_tpu

traces = 0
_injected = None


def _count_traces() -> None:
    """Count Dynamo's bytecode tracing runs (the work a cache hit skips)."""
    from torch._dynamo import symbolic_convert

    original = symbolic_convert.InstructionTranslator.run

    def run(self):  # noqa: ANN001, ANN202
        global traces
        traces += 1
        return original(self)

    symbolic_convert.InstructionTranslator.run = run


class MLP(torch.nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(width, 32)
        self.fc2 = torch.nn.Linear(32, width)
        self.scale = float(os.environ.get("CHILD_SCALE", "1.0"))  # a plain attribute: guarded, not keyed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.environ.get("CHILD_BREAK") == "1":
            torch._dynamo.graph_break()
        return self.fc2(torch.relu(self.fc1(x))) * self.scale + x


def build(kind: str):  # noqa: ANN201
    torch.manual_seed(0)
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, vocab_size=128, max_position_embeddings=64)
        model = LlamaForCausalLM(cfg).eval()
        return model, {"input_ids": torch.randint(0, 128, (1, 8))}
    if kind.startswith("zoo:"):  # a built-in zoo entry, as the sweep builds it
        from harness.zoo import load_zoo

        built = next(e for e in load_zoo("full") if e.id == kind[4:]).build(0)
        return built.model, built.inputs
    width = int(os.environ.get("CHILD_WIDTH", "16"))
    return MLP(width).eval(), {"x": torch.randn(2, width)}


def train_step() -> None:
    """finetune_step.py's training step at toy size: GPT-2 with labels (Transformers' loss_function logs a
    warning_once inside the forward), bfloat16 autocast, backward, AdamW(fused=True); the losses of 2 steps."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).to("tpu").train()
    ids = torch.randint(0, 128, (2, 16)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    if os.environ.get("CHILD_BREAK") == "1":  # a graph break in the first block: the ordinary path
        model.transformer.h[0].register_forward_pre_hook(lambda *_: torch._dynamo.graph_break())
    compiled = torch.compile(model, backend="tpu")
    losses = []
    for _ in range(2):
        with torch.autocast("tpu", dtype=torch.bfloat16):
            loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    stats = hf_tpu.compile_stats()
    print(json.dumps({"losses": losses, "traces": traces, "graphs": stats["graphs"], "tiers": stats["tiers"],
                      "graph_breaks": stats["graph_breaks"]}))


def main() -> None:
    import torch._dynamo

    _count_traces()
    if sys.argv[1] == "train":
        return train_step()
    if os.environ.get("CHILD_THREADS"):
        torch.set_num_threads(int(os.environ["CHILD_THREADS"]))
    hf_tpu.set_matmul_precision(os.environ.get("CHILD_PRECISION", "highest"))
    if os.environ.get("CHILD_INJECT") == "1":
        # an injected lowering change: aten.relu lowered as identity (the op's lowering, not the graph)
        from hf_tpu import hooks

        relu = torch.ops.aten.relu.default
        # for the child's whole life: entered, never left (held, or the generator's cleanup would leave it)
        global _injected
        _injected = hooks.override_lowerings(lambda op, fn: (lambda x: x) if op is relu else None)
        _injected.__enter__()
    if os.environ.get("CHILD_PREBUILD"):
        # models built earlier in the process (as in a sweep worker) must not shape the saved graph's guards
        import transformers

        for name in os.environ["CHILD_PREBUILD"].split(","):
            config = getattr(transformers, f"{name}Config")(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                            num_attention_heads=2, vocab_size=128)
            getattr(transformers, f"{name}Model")(config)
    model, inputs = build(sys.argv[1])
    with torch.no_grad():
        expected = model(**inputs)
        expected = expected.logits if hasattr(expected, "logits") else getattr(expected, "last_hidden_state", expected)
        model = model.to("tpu")
        dev_inputs = {k: v.to("tpu") for k, v in inputs.items()}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled = torch.compile(model, backend="tpu")
            out = compiled(**dev_inputs)
            out = (out.logits if hasattr(out, "logits") else getattr(out, "last_hidden_state", out)).cpu()
            again = compiled(**dev_inputs)
            again = (again.logits if hasattr(again, "logits") else getattr(again, "last_hidden_state", again)).cpu()
    stats = hf_tpu.compile_stats()
    print(json.dumps({
        "max_err": (out - expected).abs().max().item(),
        "again_err": (again - expected).abs().max().item(),
        "traces": traces,
        "graphs": stats["graphs"],
        "tiers": stats["tiers"],
        "warnings": [str(w.message) for w in caught if "compile cache" in str(w.message)],
    }))


if __name__ == "__main__":
    main()
