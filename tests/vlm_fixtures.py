"""A tiny random LLaVA (CLIP tower 32×32 px, 16 tokens per image; a 2-layer Llama on the SmolLM2
tokenizer plus `<image>`) saved as a Hugging Face dir, built from configs: no download."""

from __future__ import annotations

from pathlib import Path

import torch

TOKENS_PER_IMAGE = 16


def build_tiny_llava(tokenizer_dir: str, out: Path) -> Path:
    from transformers import (AutoTokenizer, CLIPImageProcessor, CLIPVisionConfig, LlamaConfig,
                              LlavaConfig, LlavaForConditionalGeneration)

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, image_size=32, patch_size=8)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                       max_position_embeddings=4096, tie_word_embeddings=False,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)
    config = LlavaConfig(vision_config=vision.to_dict(), text_config=text.to_dict(),
                         image_token_id=image_id, image_seq_length=TOKENS_PER_IMAGE,
                         vision_feature_layer=-2, vision_feature_select_strategy="default")
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():  # random features large enough to move logits visibly
        model.model.multi_modal_projector.linear_2.weight.mul_(20.0)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
                       ).save_pretrained(out)
    return out
