"""Tiny random models for real SGLang with no hub: a Llama target and an EAGLE-3 draft.

Eight layers at least: EAGLE-3 taps three hidden states (layers 2, n/2 and n-3), and with four
layers two coincide and the draft's `fc` gets the wrong width. Heads (8) and KV heads (4) divide by
2, so the same models serve tensor parallelism 2. No tokenizer: the server runs with
`--skip-tokenizer-init` and requests send `input_ids`. A random draft is rejected at every step:
`sglang:spec_accept_length` 1.0, a real speculative regression.
"""

from __future__ import annotations

import json
from pathlib import Path

HIDDEN, LAYERS, HEADS, KV_HEADS, INTER, VOCAB = 512, 8, 8, 4, 1024, 4096


def make_target(path: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (path / "config.json").exists():
        return path
    cfg = LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, vocab_size=VOCAB, max_position_embeddings=4096, torch_dtype="bfloat16",
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def make_draft(path: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    if (path / "config.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    head = HIDDEN // HEADS
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTER, "num_hidden_layers": 1, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "draft_vocab_size": VOCAB,
        "target_hidden_size": HIDDEN, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    g = torch.Generator().manual_seed(1)

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    ones = torch.ones(HIDDEN, dtype=torch.bfloat16)
    tensors = {
        "midlayer.self_attn.q_proj.weight": w(HEADS * head, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": w(KV_HEADS * head, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": w(KV_HEADS * head, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": w(HIDDEN, HEADS * head),
        "midlayer.mlp.gate_proj.weight": w(INTER, HIDDEN),
        "midlayer.mlp.up_proj.weight": w(INTER, HIDDEN),
        "midlayer.mlp.down_proj.weight": w(HIDDEN, INTER),
        "midlayer.input_layernorm.weight": ones.clone(),
        "midlayer.hidden_norm.weight": ones.clone(),
        "midlayer.post_attention_layernorm.weight": ones.clone(),
        "fc.weight": w(HIDDEN, 3 * HIDDEN),
        "norm.weight": ones.clone(),
        "lm_head.weight": w(VOCAB, HIDDEN),
        "embed_tokens.weight": w(VOCAB, HIDDEN),
    }
    save_file(tensors, str(path / "model.safetensors"))
    return path


if __name__ == "__main__":
    import sys

    root = Path(sys.argv[1])
    print(make_target(root / "target"), make_draft(root / "draft"))
