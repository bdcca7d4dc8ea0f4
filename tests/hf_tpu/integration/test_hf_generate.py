"""Issue 3, point 3: greedy `generate` on tpu gives CPU's tokens, eager and through Transformers' own compile
(static cache), with the number of XLA compilations of a 16-token generation bounded."""

import pytest
from _hf_tiny import gpt2, llama, save_tiny, t5, token_inputs

import hf_tpu

MODELS = {
    "llama": ("AutoModelForCausalLM", llama),
    "gpt2": ("AutoModelForCausalLM", gpt2),
    "t5": ("AutoModelForSeq2SeqLM", t5),
}
# One 16-token generation with cache_implementation="static": the prefill runs eagerly, the 15 decode
# steps run one compiled graph with static shapes -> 1 Dynamo graph, 1 XLA compilation (measured).
MAX_COMPILATIONS_PER_GENERATION = 2


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    import transformers

    loaded = {}

    def get(name):
        if name not in loaded:
            auto, config = MODELS[name]
            path = save_tiny(auto, config(), tmp_path_factory.mktemp(name))
            cls = getattr(transformers, auto)
            loaded[name] = cls.from_pretrained(path).eval(), cls.from_pretrained(path, device_map="tpu").eval()
        return loaded[name]

    return get


def _prompt():
    return token_inputs()["input_ids"]  # (2, 7): the loading tests' shape, so the prefill reuses their programs


@pytest.mark.parametrize("name", ["gpt2", pytest.param("llama", marks=pytest.mark.slow),
                                  pytest.param("t5", marks=pytest.mark.slow)])
def test_greedy_generate_matches_cpu(name, pair, highest):
    """The default path (DynamicCache): every decode step has new shapes, so eager mode compiles its
    attention ops again at each step (slow on first use: Llama and T5 run in the slow set)."""
    cpu, tpu = pair(name)
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
    ref = cpu.generate(_prompt(), **kw)
    out = tpu.generate(_prompt().to("tpu"), **kw)
    assert out.device.type == "tpu"
    assert out.cpu().tolist() == ref.tolist()


@pytest.mark.parametrize("name", ["t5", pytest.param("gpt2", marks=pytest.mark.slow),
                                  pytest.param("llama", marks=pytest.mark.slow)])
def test_greedy_generate_static_cache_eager_matches_cpu(name, pair, highest):
    """Eager greedy decoding with fixed shapes (static cache, Transformers' compile turned off). In the fast
    set: GPT-2 through the default path above, Llama through the compiled path below, T5 here."""
    cpu, tpu = pair(name)
    kw = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, cache_implementation="static")
    ref = cpu.generate(_prompt(), **kw)
    hf_tpu.reset_compile_stats()
    out = tpu.generate(_prompt().to("tpu"), disable_compile=True, **kw)
    assert hf_tpu.compile_stats()["graphs"] == 0
    assert out.device.type == "tpu"
    assert out.cpu().tolist() == ref.tolist()


@pytest.mark.parametrize("name", ["llama", pytest.param("gpt2", marks=pytest.mark.slow),
                                  pytest.param("t5", marks=pytest.mark.slow)])
def test_static_cache_generate_compiles_for_tpu_and_matches_cpu(name, pair, highest):
    cpu, tpu = pair(name)
    kw = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, cache_implementation="static")
    ref = cpu.generate(_prompt(), **kw)
    hf_tpu.reset_compile_stats()
    out = tpu.generate(_prompt().to("tpu"), **kw)
    stats = hf_tpu.compile_stats()
    assert out.cpu().tolist() == ref.tolist()
    # Transformers' own choice for a tpu model (PreTrainedModel._default_compile_config): no patch needed
    config = tpu._last_compile_config
    assert (config.backend, config.dynamic) == ("tpu", False), config
    assert 1 <= stats["compilations"] <= MAX_COMPILATIONS_PER_GENERATION, stats
    assert stats["graph_breaks"] == 0, stats
    print(f"\n{name}: 16-token static-cache generation: {stats}")
    # the same generation again reuses the compiled program
    out = tpu.generate(_prompt().to("tpu"), **kw)
    assert out.cpu().tolist() == ref.tolist()
    assert hf_tpu.compile_stats()["compilations"] == stats["compilations"]
