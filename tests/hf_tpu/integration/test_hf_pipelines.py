"""Issue 3, point 4: Transformers pipelines with device="tpu"."""

import pytest
import torch
from _hf_tiny import bert, bert_tokenizer, gpt2, gpt2_tokenizer, save_tiny


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    tok = gpt2_tokenizer()
    path = save_tiny("AutoModelForCausalLM", gpt2(vocab=len(tok)), tmp_path_factory.mktemp("gpt2"))
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    tok = bert_tokenizer()
    path = save_tiny("AutoModel", bert(), tmp_path_factory.mktemp("bert"))
    tok.save_pretrained(path)
    return path


def test_text_generation_pipeline_on_tpu(gpt2_dir, highest):
    from transformers import pipeline

    kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False)
    pipe = pipeline("text-generation", model=str(gpt2_dir), device="tpu")
    assert pipe.device.type == "tpu" and pipe.model.device.type == "tpu"
    out = pipe("hello cat", **kw)[0]["generated_text"]
    ref = pipeline("text-generation", model=str(gpt2_dir), device="cpu")("hello cat", **kw)[0]["generated_text"]
    assert out == ref and len(out) > len("hello cat")


def test_feature_extraction_pipeline_on_tpu(bert_dir, highest):
    from transformers import pipeline

    pipe = pipeline("feature-extraction", model=str(bert_dir), device="tpu")
    assert pipe.model.device.type == "tpu"
    out = torch.tensor(pipe("hello world")[0])
    ref = torch.tensor(pipeline("feature-extraction", model=str(bert_dir), device="cpu")("hello world")[0])
    assert out.shape == ref.shape == (4, 32)
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-5)
