"""Models-list CSV resolved through a small fake Hugging Face cache made by the test (no network)."""

import json

import pytest

from harness.zoo import load_zoo, output_tensors

COMMIT = "0123456789abcdef0123456789abcdef01234567"

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
    "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2,
}


def _cache_repo(cache, model_id: str, files: dict[str, dict]) -> None:
    """The layout huggingface_hub writes: refs/main -> commit, snapshots/<commit>/<file>."""
    repo = cache / f"models--{model_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for name, content in files.items():
        (snapshot / name).write_text(json.dumps(content))


@pytest.fixture
def models_csv(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    _cache_repo(cache, "tiny-org/tiny-llama", {"config.json": LLAMA_CONFIG})  # config cached, no weights
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    path = tmp_path / "models.csv"
    path.write_text("model_id,model_type,pipeline_tag\n"
                    "tiny-org/tiny-llama,llama,text-generation\n"
                    "someone/not-cached,bert,fill-mask\n"
                    "tiny-org/tiny-llama,llama,text-generation\n")
    return str(path)


def test_cached_config_builds_real_architecture_with_capped_layers(models_csv):
    entries = load_zoo(models_csv, hub_layers=1)
    assert [e.id for e in entries] == ["hub/tiny-org/tiny-llama", "hub/someone/not-cached"]
    llama = entries[0]
    assert llama.available and llama.library == "hub" and llama.task == "causal-lm"
    assert llama.model_class == "LlamaForCausalLM"
    built = llama.build(seed=0)
    config = built.model.config
    assert config.num_hidden_layers == 1  # capped
    assert config.hidden_size == 64 and config.vocab_size == 512  # real widths kept
    assert "logits" in output_tensors(built.run())


def test_uncached_id_is_not_available_with_reason(models_csv):
    missing = load_zoo(models_csv)[1]
    assert not missing.available
    assert "not in the local Hugging Face cache" in missing.reason
    assert missing.task == "masked-lm"
    with pytest.raises(Exception, match="not in the local Hugging Face cache"):
        missing.build()


def test_malformed_csv(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("name,pipeline_tag\nfoo,fill-mask\n")
    with pytest.raises(ValueError, match="no `model_id` column"):
        load_zoo(str(bad))
    empty_id = tmp_path / "empty.csv"
    empty_id.write_text("model_id\n\n,\n")
    with pytest.raises(ValueError, match="empty model_id"):
        load_zoo(str(empty_id))
