"""A tiny random Llama and a byte-level tokenizer, built in code from a seed (for tests)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from tss_opt.config.model import TinyConfig

# ChatML, as SmolLM2 uses it, so prompt formatting takes the same path as the real model.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with no merges: 256 byte tokens plus ChatML specials (259 ids)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte_vocab = {ch: i for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    byte_vocab = {ch: i for i, ch in enumerate(sorted(byte_vocab))}
    for i, tok in enumerate(SPECIAL_TOKENS):
        byte_vocab[tok] = 256 + i
    core = Tokenizer(models.BPE(vocab=byte_vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS,
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def build_tiny_model(cfg: TinyConfig, num_layers: int, seed: int, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """A randomly initialised Llama of ``cfg``'s shape; the same seed gives the same weights."""
    config = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        eos_token_id=258,
        bos_token_id=257,
        pad_token_id=256,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        # Larger-than-default init makes the random model's next-token choices sharp and
        # layer-dependent, so skipping a layer really changes the greedy output.
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.08)
    finally:
        torch.random.set_rng_state(generator_state)
    return model.to(dtype).eval()
