"""`Engine` on an SGLang server, over its HTTP API only (token ids in, token ids + logprobs out).

The wire protocol (SGLang 0.5.x, server started with `--skip-tokenizer-init`):
- `POST /generate` with `input_ids` (a list per prompt), one `sampling_params` dict per prompt
  (`sampling_seed` per prompt, so a seeded call means the same as on the in-process engine),
  `return_logprob: true`, `logprob_start_len: -1` (output tokens only). Each answer has
  `output_ids` and `meta_info.output_token_logprobs` as `[logprob, token_id, text]` entries and
  `meta_info.finish_reason` (`{"type": "stop", "matched": id}`, `{"type": "length", ...}` or
  `{"type": "abort", "message": ...}`).
- `POST /update_weights_from_disk` with `model_path`: the new actor, after every update.
The server runs with SGLANG_RETURN_ORIGINAL_LOGPROB=1, so logprobs are of the untempered policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import requests

from longturn.device import local_rank
from longturn.params.config import SGLangParams
from longturn.errors import SettingError
from longturn.engines.base import Completion, SamplingParams
from longturn.engines.row_seeds import prompt_seeds
from longturn.engines.sglang_server import SGLangError, SGLangServer, launch_command
from longturn.engines.stop_tokens import end_of_turn_ids

TOP_K_ALL = -1  # SGLang's "no top-k"; longturn says 0


def request_body(prompt_ids: list[list[int]], sampling: SamplingParams,
                 stop_ids: set[int]) -> dict[str, Any]:
    """The `/generate` JSON for a batch: one sampling dict per prompt, each with its own seed
    (`prompt_seeds` of `sampling.seed`, as the in-process engine draws them)."""
    params = {"max_new_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
              "top_p": sampling.top_p, "top_k": sampling.top_k or TOP_K_ALL,
              "stop_token_ids": sorted(stop_ids), "no_stop_trim": True}
    seed, count = sampling.seed, len(prompt_ids)
    seeds = [None] * count if seed is None else prompt_seeds(seed, count)
    return {"input_ids": [list(map(int, p)) for p in prompt_ids],
            "sampling_params": [params if s is None else {**params, "sampling_seed": s}
                                for s in seeds],
            "return_logprob": True, "logprob_start_len": -1}


def parse_completion(item: dict[str, Any]) -> Completion:
    """One `/generate` answer as a Completion; the sampled ids come from the logprob entries, which
    keep the end-of-turn token even where `output_ids` has it trimmed."""
    try:
        meta = item["meta_info"]
        entries = meta["output_token_logprobs"]
        reason = meta["finish_reason"]
        token_ids = [int(entry[1]) for entry in entries]
        logprobs = [float(entry[0]) for entry in entries]
        output_ids = [int(t) for t in item.get("output_ids", token_ids)]
    except (KeyError, TypeError, IndexError, ValueError) as err:
        raise SGLangError(f"/generate answered outside the protocol ({err!r}): {str(item)[:300]}")
    if token_ids[: len(output_ids)] != output_ids:
        raise SGLangError(f"output_ids {output_ids} disagree with the logprob token ids {token_ids}")
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind == "abort":
        raise SGLangError(f"SGLang aborted a request: {reason}")
    if kind not in ("stop", "length"):
        raise SGLangError(f"unknown finish_reason {reason!r}")
    return Completion(token_ids, logprobs, kind)


class SGLangEngine:
    """Talks to `base_url`; closes `server` (if it launched one) on `close()`."""

    def __init__(self, base_url: str, stop_ids: set[int], request_timeout_s: float = 900.0,
                 server: SGLangServer | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.stop_ids = set(stop_ids)
        self.timeout = request_timeout_s
        self.server = server
        self.http = requests.Session()

    def _post(self, route: str, body: dict[str, Any]) -> requests.Response:
        try:
            return self.http.post(f"{self.base_url}{route}", json=body, timeout=self.timeout)
        except requests.RequestException as err:
            where = f" (server log: {self.server.log_path})" if self.server else ""
            raise SGLangError(f"SGLang server at {self.base_url} did not answer {route}: "
                              f"{err}{where}") from None

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams,
                 images: list | None = None) -> list[Completion]:
        if images is not None:
            raise SettingError("image observations need engine.name 'hf' in this version: the "
                               "SGLang engine sends token ids only")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        if not prompt_ids:
            return []
        response = self._post("/generate", request_body(prompt_ids, sampling, self.stop_ids))
        if response.status_code != 200:
            raise SGLangError(f"/generate answered {response.status_code}: {response.text[:500]}")
        items = response.json()
        items = items if isinstance(items, list) else [items]
        if len(items) != len(prompt_ids):
            raise SGLangError(f"/generate returned {len(items)} answers for {len(prompt_ids)} prompts")
        return [parse_completion(item) for item in items]

    def update_weights(self, model_dir: str) -> None:
        """Load the actor saved under `model_dir` (a path the server can read) in place."""
        path = str(Path(model_dir).resolve())
        response = self._post("/update_weights_from_disk", {"model_path": path, "flush_cache": True})
        try:
            answer = response.json()
        except ValueError:
            answer = {"success": False, "message": response.text[:500]}
        if response.status_code != 200 or not answer.get("success", False):
            raise SGLangError(f"SGLang could not load weights from {path}: "
                              f"{answer.get('message', answer)}")

    def close(self) -> None:
        self.http.close()
        if self.server is not None:
            self.server.stop()
            self.server = None


def model_stop_ids(model_dir: str) -> set[int]:
    """End-of-turn ids of the served model, read from its tokenizer and generation config."""
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    try:
        generation_eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:  # no generation_config.json
        generation_eos = None
    return end_of_turn_ids(tokenizer, generation_eos)


def make_sglang_engine(model_dir: str, settings: SGLangParams) -> SGLangEngine:
    """Attach to `settings.url`, or launch this rank's own server (port + local rank, its GPU)."""
    stop_ids = model_stop_ids(model_dir)
    if settings.url:
        return SGLangEngine(settings.url, stop_ids, settings.request_timeout_s)
    rank = local_rank()
    port = settings.port + rank
    cmd = launch_command(settings.python, str(Path(model_dir).resolve()), settings.host, port,
                         settings.tp_size, rank * settings.tp_size,
                         settings.mem_fraction_static, settings.extra_args)
    server = SGLangServer(cmd, settings.host, port, settings.startup_timeout_s,
                          settings.log_dir).start()
    return SGLangEngine(server.url, stop_ids, settings.request_timeout_s, server)
