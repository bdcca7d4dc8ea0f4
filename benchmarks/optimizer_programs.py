"""CPU seconds inside AdamW(fused=True).step() on tpu for 7 tiny Transformers models trained one after another
in one process, as a sweep worker trains its entries (3 steps each): how much tracing and lowering the fused
optimizer's programs cost per model (hf_tpu/optim_lowerings.py: programs per chunk of same-shaped
parameters, shared across models). Not a test: the figures depend on the machine's load; run it twice with the
same HF_TPU_CACHE_DIR and read the second (warm) run.

    HF_HUB_OFFLINE=1 HF_TPU_CACHE_DIR=/tmp/optcache python benchmarks/optimizer_programs.py
"""
import os, sys, time, json
import torch, transformers
import hf_tpu
from transformers import (BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, T5Config, T5ForConditionalGeneration, ViTConfig, ViTModel, RobertaConfig,
                          RobertaModel, MistralConfig, MistralForCausalLM)
torch.manual_seed(0)
models = {
  "bert": lambda: BertForSequenceClassification(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)),
  "roberta": lambda: RobertaModel(RobertaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)),
  "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4)),
  "llama": lambda: LlamaForCausalLM(LlamaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=37)),
  "mistral": lambda: MistralForCausalLM(MistralConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=37)),
  "t5": lambda: T5ForConditionalGeneration(T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0)),
  "vit": lambda: ViTModel(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, image_size=32, patch_size=8)),
}
res = {}
for name, mk in models.items():
    m = mk().to("tpu"); m.eval()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    if name == "vit":
        x = {"pixel_values": torch.randn(2, 3, 32, 32).to("tpu")}
    elif name == "t5":
        ids = torch.randint(0, 99, (2, 8)); x = {"input_ids": ids.to("tpu"), "labels": ids.to("tpu")}
    else:
        x = {"input_ids": torch.randint(0, 99, (2, 8)).to("tpu")}
    step_cpu = 0.0
    for k in range(3):
        out = m(**x)
        t = out[0] if isinstance(out[0], torch.Tensor) else out.last_hidden_state
        t.float().pow(2).mean().backward()
        c0 = time.process_time(); opt.step(); next(m.parameters()).detach().cpu(); step_cpu += time.process_time() - c0
        opt.zero_grad()
    res[name] = round(step_cpu, 3)
print(json.dumps(res), "total", round(sum(res.values()), 2))
