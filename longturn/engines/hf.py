"""In-process transformers engine: batched, seeded sampling with raw-policy logprobs, fast enough
to keep a GPU busy.

A decode loop of its own instead of `model.generate`, so that:
- logprobs are log_softmax of the RAW logits (no temperature / top-k / top-p), the numbers the
  trainer recomputes;
- there are no hidden defaults (transformers 5 samples with top_k=50 unless told otherwise);
- each prompt samples from its own seed, with no per-row generator and no host round trip per
  token (`sampler`, `decode_state`);
- the token prefix every prompt of a batch shares (system prompt + worked examples) is computed
  once and, on the fast path, also attended to once per step (`static_kv`).

Llama, Qwen2 and Qwen3 models decode on that fast path (`static_decoder`: fixed-size KV buffers,
CUDA-graph replay of each step on a GPU); other causal LMs on the model's own forward
(`generic_decoder`).

A vision-language model (a model dir with `vision/`, see `vision.encoder`) decodes on the generic
path without prefix sharing; `generate(..., images=...)` encodes each prompt's frames and puts
their features at the given starts during prefill.

Seeding guarantee: with `sampling.seed` set, the same call (same prompts, order, params, engine
settings, device) returns identical tokens. A prompt's random draws depend only on the seed and
its index in the call, not on the batch size or on which prompts share its batch; its tokens can
still differ across batch layouts (or prefix sharing on vs off) when padding or the split prefill
changes the logits in the last bits (bf16 mostly) and that flips a draw that sat on a boundary.
Without a seed, row seeds are drawn from torch's global RNG, so `torch.manual_seed` makes whole
runs reproducible. A call may also carry one seed per prompt (`sampling.seed` a tuple): evaluation
episodes do, so an episode samples the same whatever shares its batch.
"""

from __future__ import annotations

import gc
from contextlib import AbstractContextManager, nullcontext
from typing import Mapping

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from longturn.engines.decoder_stack import decoder_of
from longturn.engines.base import Completion, SamplingParams
from longturn.engines.generic_decoder import GenericDecoder
from longturn.engines.prefix import left_pad
from longturn.engines.row_seeds import prompt_seeds
from longturn.engines.static_decoder import StaticDecoder
from longturn.engines.stop_tokens import end_of_turn_ids
from longturn.vision import feed
from longturn.vision.encoder import load_vision

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


class HFEngine:
    """`Engine` on a local transformers causal LM (CPU runs, one-GPU runs, reference numbers)."""

    def __init__(
        self,
        model_dir: str,
        dtype: str = "bfloat16",
        device: str | torch.device = "cpu",
        batch_size: int | None = None,
        prefix_sharing: bool = True,
        cuda_graphs: bool = True,
        fast_path: bool = True,
    ) -> None:
        """`prefix_sharing`: compute a batch's common token prefix once (off: every row in full,
        e.g. to compare against); `fast_path` off forces the generic decoder."""
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dtype, self.device, self.batch_size = _DTYPES[dtype], torch.device(device), batch_size
        self.prefix_sharing, self.cuda_graphs = prefix_sharing, cuda_graphs
        self.fast_path = fast_path
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=self.dtype)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.vision = load_vision(model_dir, self.device, self.dtype)
        if self.vision is not None:  # one plain prefill, where the image hook finds its ids
            self.prefix_sharing = self.fast_path = False
            feed.attach(self.model)
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        self.stop_ids = end_of_turn_ids(self.tokenizer, eos)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.stop_ids, default=0)
        self._decoder = self._make_decoder()

    def _make_decoder(self) -> StaticDecoder | GenericDecoder:
        stops = torch.tensor(sorted(self.stop_ids), dtype=torch.long)
        decoder = decoder_of(self.model) if self.fast_path else None
        if decoder is not None:
            return StaticDecoder(self.model, decoder, self.pad_id, stops, self.device,
                                 self.prefix_sharing, self.cuda_graphs)
        return GenericDecoder(self.model, self.pad_id, stops, self.device, self.prefix_sharing)

    @property
    def decoder_name(self) -> str:
        """Which decode loop serves this model ('static' or 'generic')."""
        return "static" if isinstance(self._decoder, StaticDecoder) else "generic"

    def update_weights(self, model_dir: str) -> None:
        """Load weights saved under model_dir; refuses a different architecture."""
        new = AutoModelForCausalLM.from_pretrained(model_dir, dtype=self.dtype)
        self.load_weights(new.state_dict())
        del new
        self._free()

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy weights in place (names as in a plain HF state dict): no disk, and buffers and
        captured graphs keep pointing at the same memory. Refuses missing names or new shapes."""
        model = self._live_model()
        with torch.no_grad():
            params = dict(model.named_parameters())
            missing = sorted(set(params) - set(state))
            wrong = sorted(k for k, p in params.items() if k in state and state[k].shape != p.shape)
            if missing or wrong:
                raise ValueError(f"weights hold a different architecture than the loaded model "
                                 f"(missing {missing[:3]}, other shapes {wrong[:3]})")
            for name, param in params.items():
                param.copy_(state[name].to(device=param.device, dtype=param.dtype))

    def close(self) -> None:
        self.model = None
        self._decoder = None
        self._free()

    def _free(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _live_model(self) -> torch.nn.Module:
        if self.model is None:
            raise RuntimeError("engine is closed")
        return self.model

    @torch.inference_mode()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams,
                 images: list[list[tuple[int, np.ndarray]]] | None = None) -> list[Completion]:
        """One Completion per prompt, in input order; longest prompts are batched together.
        `images[i]`: prompt i's (start of its placeholders, RGB frame) pairs."""
        self._live_model()
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        if images is not None and self.vision is None:
            raise ValueError("images were given but this model has no image side (no vision/ "
                             "in its model dir)")
        if sampling.max_new_tokens < 1:
            return [Completion([], [], "length") for _ in prompt_ids]
        seed = sampling.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())
        per_prompt = prompt_seeds(seed, len(prompt_ids))
        order = sorted(range(len(prompt_ids)), key=lambda i: -len(prompt_ids[i]))
        size = self.batch_size or max(len(order), 1)
        results: list[Completion | None] = [None] * len(prompt_ids)
        for start in range(0, len(order), size):
            chunk = order[start : start + size]
            seeds = torch.tensor([per_prompt[i] for i in chunk], dtype=torch.long)
            prompts = [prompt_ids[i] for i in chunk]
            with self._images([images[i] for i in chunk] if images else None, prompts):
                state = self._decoder.decode(prompts, sampling, seeds)
            for i, completion in zip(chunk, state.completions()):
                results[i] = completion
        return results  # type: ignore[return-value]

    def _images(self, images: list[list[tuple[int, np.ndarray]]] | None,
                prompts: list[list[int]]) -> AbstractContextManager:
        """The prefill's image features, encoded in one pass over the chunk's frames."""
        if not feed.has_images(images):
            return nullcontext()
        ids, mask = left_pad(prompts, self.pad_id, self.device)  # as the prefill lays them out
        return feed.images_context(self.vision, ids, mask, images)
