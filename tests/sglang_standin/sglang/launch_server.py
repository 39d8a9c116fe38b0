"""Test stand-in for `python -m sglang.launch_server`: the same flags, the same HTTP protocol.

It serves a transformers model from `--model-path` with its own plain decode loop (no KV cache,
no longturn engine code), so tests check longturn's SGLang client against an independent peer:
- `GET /health`; `POST /generate` (batched `input_ids`, per-prompt `sampling_params` with
  `sampling_seed`, `stop_token_ids`, `no_stop_trim`; `return_logprob`); `POST
  /update_weights_from_disk`;
- like SGLang, `top_k` must be -1 or >= 1, a matched stop token is trimmed from `output_ids` unless
  `no_stop_trim`, and logprobs are tempered unless SGLANG_RETURN_ORIGINAL_LOGPROB is set;
- every request body is appended to $STANDIN_REQUEST_LOG (JSON lines) when that is set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

import torch
from transformers import AutoModelForCausalLM

ORIGINAL_LOGPROB = os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in ("1", "true")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sglang.launch_server (test stand-in)")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--random-seed", type=int, default=None)
    return p.parse_args(argv)


def load(path: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def sample_one(model, prompt: list[int], sp: dict) -> dict:
    temperature, top_k = float(sp.get("temperature", 1.0)), int(sp.get("top_k", -1))
    stop = set(sp.get("stop_token_ids") or [])
    generator = torch.Generator().manual_seed(int(sp.get("sampling_seed", 0)))
    ids, out, entries, reason = list(prompt), [], [], None
    for _ in range(int(sp.get("max_new_tokens", 128))):
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        scaled = logits / max(temperature, 1e-6)
        if top_k > 0:
            scaled = scaled.masked_fill(scaled < torch.topk(scaled, top_k).values[-1], float("-inf"))
        token = int(torch.multinomial(scaled.softmax(-1), 1, generator=generator))
        source = logits if ORIGINAL_LOGPROB else scaled
        entries.append([float(source.log_softmax(-1)[token]), token, None])
        ids.append(token)
        out.append(token)
        if token in stop:
            reason = {"type": "stop", "matched": token}
            break
    if reason is None:
        reason = {"type": "length", "length": len(out)}
    elif not sp.get("no_stop_trim", False):
        out = out[:-1]
    return {"output_ids": out, "meta_info": {
        "id": os.urandom(4).hex(), "finish_reason": reason, "prompt_tokens": len(prompt),
        "completion_tokens": len(entries), "cached_tokens": 0, "output_token_logprobs": entries}}


def generate(model, body: dict) -> tuple[int, object]:
    batch = body["input_ids"]
    single = not batch or not isinstance(batch[0], list)
    prompts = [batch] if single else batch
    sps = body.get("sampling_params") or {}
    sps = sps if isinstance(sps, list) else [sps] * len(prompts)
    for sp in sps:
        if int(sp.get("top_k", -1)) < 1 and int(sp.get("top_k", -1)) != -1:
            return 400, {"error": {"message": f"top_k must be -1 (disable) or at least 1, "
                                              f"got {sp['top_k']}."}}
    answers = [sample_one(model, p, sp) for p, sp in zip(prompts, sps)]
    return 200, answers[0] if single else answers


def make_handler(state: dict):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep the server log to what matters
            pass

        def _answer(self, code: int, payload: object) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer(200, {}) if self.path == "/health" else self._answer(404, {})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if os.environ.get("STANDIN_REQUEST_LOG"):
                with open(os.environ["STANDIN_REQUEST_LOG"], "a") as f:
                    f.write(json.dumps({"route": self.path, "body": body}) + "\n")
            if self.path == "/generate":
                self._answer(*generate(state["model"], body))
            elif self.path == "/update_weights_from_disk":
                try:
                    state["model"] = load(body["model_path"])
                except Exception as err:  # SGLang answers 400 and keeps the old weights
                    self._answer(400, {"success": False, "message": f"Failed to update weights: {err}",
                                       "num_paused_requests": 0})
                    return
                self._answer(200, {"success": True, "message": "Succeeded to update model weights.",
                                   "num_paused_requests": 0})
            else:
                self._answer(404, {})

    return Handler


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    state = {"model": load(args.model_path)}
    print(f"stand-in SGLang serving {args.model_path} on {args.host}:{args.port}", flush=True)
    HTTPServer((args.host, args.port), make_handler(state)).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
