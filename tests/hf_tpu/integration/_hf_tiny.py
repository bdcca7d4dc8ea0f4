"""Tiny Hugging Face models, configs and tokenizers built offline in code, shared by the integration tests.

Every model uses the same small dimensions (hidden 32, 4 heads, vocabulary 99, 2 layers) so that the eager
ops they compile on `tpu` repeat across models: one process compiles each (op, shape) once."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

VOCAB = 99
SEED = 0


def _tf() -> Any:
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


def bert(**kw: Any) -> Any:
    return _tf().BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=37, max_position_embeddings=64, **kw)


def llama(**kw: Any) -> Any:
    return _tf().LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             bos_token_id=1, eos_token_id=2, pad_token_id=0, **kw)


def gpt2(vocab: int = VOCAB, **kw: Any) -> Any:
    return _tf().GPT2Config(vocab_size=vocab, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                            bos_token_id=0, eos_token_id=0, **kw)


def t5(**kw: Any) -> Any:
    return _tf().T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                          relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0,
                          eos_token_id=1, **kw)


def vit(**kw: Any) -> Any:
    return _tf().ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=37, num_labels=3, **kw)


def whisper(**kw: Any) -> Any:
    return _tf().WhisperConfig(vocab_size=VOCAB, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
                               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=37,
                               decoder_ffn_dim=37, max_source_positions=16, max_target_positions=32,
                               pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, **kw)


def wav2vec2(**kw: Any) -> Any:
    return _tf().Wav2Vec2Config(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=37, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8),
                                num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, **kw)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(SEED)


def token_inputs() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(3, VOCAB, (2, 7), generator=_gen())}


def seq2seq_inputs() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (2, 7), generator=_gen())
    return {"input_ids": ids, "decoder_input_ids": ids[:, :4]}


def image_inputs() -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(2, 3, 16, 16, generator=_gen())}


def whisper_inputs() -> dict[str, torch.Tensor]:
    g = _gen()
    return {"input_features": torch.randn(2, 8, 32, generator=g),
            "decoder_input_ids": torch.randint(3, VOCAB, (2, 4), generator=g)}


def audio_inputs() -> dict[str, torch.Tensor]:
    return {"input_values": torch.randn(2, 400, generator=_gen())}


# (Auto class, config builder, inputs, output field compared)
AUTO_CASES: dict[str, tuple[str, Any, Any, str]] = {
    "AutoModel": ("AutoModel", bert, token_inputs, "last_hidden_state"),
    "ForCausalLM": ("AutoModelForCausalLM", llama, token_inputs, "logits"),
    "ForSequenceClassification": ("AutoModelForSequenceClassification", lambda: bert(num_labels=3), token_inputs,
                                  "logits"),
    "ForMaskedLM": ("AutoModelForMaskedLM", bert, token_inputs, "logits"),
    "ForTokenClassification": ("AutoModelForTokenClassification", lambda: bert(num_labels=5), token_inputs,
                               "logits"),
    "ForQuestionAnswering": ("AutoModelForQuestionAnswering", bert, token_inputs, "start_logits"),
    "ForSeq2SeqLM": ("AutoModelForSeq2SeqLM", t5, seq2seq_inputs, "logits"),
    "ForImageClassification": ("AutoModelForImageClassification", vit, image_inputs, "logits"),
    "SpeechSeq2Seq-Whisper": ("AutoModelForSpeechSeq2Seq", whisper, whisper_inputs, "logits"),
    "CTC-Wav2Vec2": ("AutoModelForCTC", wav2vec2, audio_inputs, "logits"),
}


def save_tiny(auto_class: str, config: Any, path: Path | str, **save_kw: Any) -> Path:
    """Random weights from `config`, saved with save_pretrained; returns the directory."""
    tf = _tf()
    torch.manual_seed(SEED)
    model = getattr(tf, auto_class).from_config(config).eval()
    model.save_pretrained(path, **save_kw)
    return Path(path)


def rel_err(ref: torch.Tensor, out: torch.Tensor) -> float:
    """max |ref - out| / max |ref|: the relative error the tolerances in docs/integration.md are stated in."""
    ref, out = ref.detach().float().cpu(), out.detach().float().cpu()
    return ((ref - out).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def on_tpu(x: Any) -> Any:
    return {k: v.to("tpu") for k, v in x.items()}


def all_on_tpu(model: torch.nn.Module) -> bool:
    return all(t.device.type == "tpu" for t in [*model.parameters(), *model.buffers()])


def gpt2_tokenizer() -> Any:
    """A byte-level BPE tokenizer over single characters (no merges), built in code."""
    vocab = {"<|endoftext|>": 0}
    for ch in "abcdefghijklmnopqrstuvwxyz.,!?'":
        vocab[ch] = len(vocab)
    vocab["\u0120"] = len(vocab)  # GPT-2's byte-level space
    return _tf().GPT2Tokenizer(vocab=vocab, merges=[])


def bert_tokenizer() -> Any:
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "a", "cat", "on", "tpu", "."]
    return _tf().BertTokenizer(vocab={w: i for i, w in enumerate(words)})


def offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
