"""In-process transformers engine: batched, KV-cached, seeded sampling with raw-policy logprobs.

A hand-written decode loop instead of `model.generate`, so that:
- logprobs are log_softmax of the RAW logits (no temperature / top-k / top-p), exactly the numbers
  `forward_logprobs` recomputes;
- there are no hidden defaults (transformers 5 samples with top_k=50 unless told otherwise);
- each prompt samples from its own torch.Generator seeded from (seed, prompt index);
- a token prefix common to a micro-batch (system prompt + worked example) is prefilled once
  (`longturn.engines.prefix`).

Seeding guarantee: with `sampling.seed` set, the same call (same prompts, order, params, engine
settings, device) returns identical tokens. A prompt's random stream depends only on the seed and
its index in the call, not on micro-batch size or on which prompts share its batch; its tokens can
still differ across batch layouts (or with `prefix_sharing` on vs off) when padding or the split
prefill changes the logits in the last bits (bf16 mostly) and that flips a draw that sat on a
boundary. Without a seed, row seeds are drawn from torch's global RNG, so `torch.manual_seed`
makes whole runs reproducible.
"""

from __future__ import annotations

import gc

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from longturn.engines.base import Completion, SamplingParams
from longturn.engines.logprobs import token_logprobs
from longturn.engines.prefix import left_pad, prefill  # noqa: F401  (left_pad: re-exported)
from longturn.engines.row_seeds import row_seed
from longturn.engines.stop_tokens import end_of_turn_ids

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def filter_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Tempered, top-k / top-p filtered float32 scores [B, V]; removed entries are -inf."""
    scores = logits.float() / sampling.temperature
    vocab = scores.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = sorted_scores.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # keep the smallest prefix reaching top_p
        drop_sorted = mass_before >= sampling.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def choose_tokens(
    logits: torch.Tensor, sampling: SamplingParams, generators: list[torch.Generator]
) -> torch.Tensor:
    """Next token per row: argmax at temperature 0, else inverse-CDF sampling with one uniform
    from each row's own generator (torch.multinomial costs ~16 ms per call on a 49k vocab)."""
    if sampling.temperature <= 0:
        return logits.argmax(-1)
    cdf = filter_logits(logits, sampling).softmax(-1).double().cumsum(-1)
    uniforms = torch.stack(
        [torch.rand((), generator=g, dtype=torch.float64, device=g.device) for g in generators]
    )
    targets = (uniforms * cdf[:, -1]).unsqueeze(-1)
    # first index whose cdf exceeds the target: never a token with zero probability
    chosen = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
    return chosen.clamp(max=cdf.shape[-1] - 1)


class HFEngine:
    """`Engine` on a local transformers causal LM (CPU tests, small runs, reference numbers)."""

    def __init__(
        self,
        model_dir: str,
        dtype: str = "bfloat16",
        device: str = "cpu",
        batch_size: int | None = None,
        stop_token_ids: list[int] | None = None,
        prefix_sharing: bool = True,
    ) -> None:
        """`prefix_sharing`: prefill a micro-batch's common token prefix once (off: the plain
        batched prefill, e.g. to compare against)."""
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dtype, self.device, self.batch_size = _DTYPES[dtype], torch.device(device), batch_size
        self.prefix_sharing = prefix_sharing
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = self._load(model_dir)
        self.stop_ids = end_of_turn_ids(
            self.tokenizer, getattr(self.model.generation_config, "eos_token_id", None), stop_token_ids)
        self._stop_tensor = torch.tensor(sorted(self.stop_ids), device=self.device)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.stop_ids, default=0)

    def _load(self, model_dir: str) -> torch.nn.Module:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=self.dtype)
        return model.to(self.device).eval()

    def update_weights(self, model_dir: str) -> None:
        """Swap in weights saved under model_dir; refuses a different architecture."""
        new = self._load(model_dir)
        old_shapes = {k: v.shape for k, v in self._live_model().state_dict().items()}
        if {k: v.shape for k, v in new.state_dict().items()} != old_shapes:
            raise ValueError(f"{model_dir} holds a different architecture than the loaded model")
        self.model = new
        self._free()

    def close(self) -> None:
        self.model = None
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
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        """One Completion per prompt, in input order; longest prompts are batched together."""
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        if sampling.max_new_tokens < 1:
            return [Completion([], [], "length") for _ in prompt_ids]
        seed = sampling.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())
        order = sorted(range(len(prompt_ids)), key=lambda i: -len(prompt_ids[i]))
        size = self.batch_size or max(len(order), 1)
        results: list[Completion | None] = [None] * len(prompt_ids)
        for start in range(0, len(order), size):
            chunk = order[start : start + size]
            generators = [self._generator(row_seed(seed, i)) for i in chunk]
            completions = self._generate_batch([prompt_ids[i] for i in chunk], sampling, generators)
            for i, completion in zip(chunk, completions):
                results[i] = completion
        return results  # type: ignore[return-value]

    def _generator(self, seed: int) -> torch.Generator:
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed)
        return generator

    def _generate_batch(
        self, prompts: list[list[int]], sampling: SamplingParams, generators: list[torch.Generator]
    ) -> list[Completion]:
        """Prefill once, then decode with the KV cache, dropping rows as they stop."""
        model = self._live_model()
        state = prefill(model, prompts, self.pad_id, self.device, self.prefix_sharing)
        cache, logits, mask, next_pos = state.cache, state.logits, state.mask, state.next_pos
        live = list(range(len(prompts)))  # batch row -> prompt index
        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        reasons = ["length"] * len(prompts)
        for step in range(sampling.max_new_tokens):
            chosen = choose_tokens(logits, sampling, [generators[i] for i in live])
            chosen_lp = token_logprobs(logits, chosen)
            stopped = torch.isin(chosen, self._stop_tensor)
            rows = zip(live, chosen.tolist(), chosen_lp.tolist(), stopped.tolist())
            for index, tok, lp, stop in rows:
                tokens[index].append(tok)
                logprobs[index].append(lp)
                if stop:
                    reasons[index] = "stop"
            if step == sampling.max_new_tokens - 1 or bool(stopped.all()):
                break
            if bool(stopped.any()):
                keep = (~stopped).nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                mask, next_pos, chosen = mask[keep], next_pos[keep], chosen[keep]
                live = [live[j] for j in keep.tolist()]
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=-1)
            out = model(input_ids=chosen[:, None], attention_mask=mask,
                        position_ids=next_pos[:, None], past_key_values=cache, use_cache=True)
            logits, next_pos = out.logits[:, -1, :], next_pos + 1
        return [Completion(t, lp, r) for t, lp, r in zip(tokens, logprobs, reasons)]
