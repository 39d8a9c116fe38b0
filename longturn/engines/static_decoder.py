"""The in-process engine's fast path: static KV buffers, cascade attention over a shared prefix,
batched counter-based sampling, and (on CUDA) each decode step replayed as one CUDA graph.

A batch is decoded in three moves: the shared prefix once at batch size 1 (kept for the next
call while the tokens and weights are the same), the prompt tails in row chunks of like width
(both eager), then `max_new_tokens − 1` decode steps that each run the whole model, sample,
record and advance every counter on the device. The host only asks "has every row stopped?"
every few steps; on the CPU it asks every step and drops the stopped rows. On CUDA the step is
captured once per buffer shape (sizes rounded up so consecutive batches reuse it) and replayed;
capture problems fall back to eager steps with a warning, never to different results.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
import torch
from torch import nn

from longturn.engines.prefix_memo import weights_version
from longturn.engines.base import SamplingParams
from longturn.engines.decode_state import DecodeState, check_interval
from longturn.engines.prefix import left_pad
from longturn.engines.shared_prefix import shared_prefix_length
from longturn.engines.static_kv import KVBuffers, forward_tokens
from longturn.profiling import DECODE_STEP, mark

log = logging.getLogger(__name__)
PREFIX_BUCKET, WIDTH_BUCKET = 64, 32  # buffer sizes are rounded up to these (graph reuse)
PREFILL_ROWS = 64  # prompt tails are prefilled this many rows at a time (bounded memory)
PREFILL_FILL = 0.85  # ... and with rows at least this fraction of their chunk's widest tail
KEEP_GRAPHS = 2
DROP_AT = 0.75  # CPU: stopped rows leave the batch once at most this share of it still decodes


def _round_up(n: int, bucket: int) -> int:
    return -(-n // bucket) * bucket


def row_bucket(rows: int) -> int:
    """Rows a captured graph is built for: a power of two up to 64, then a multiple of 64, so an
    evaluation whose active envs drain one by one reuses a handful of graphs."""
    return 1 << (rows - 1).bit_length() if rows <= 64 else _round_up(rows, 64)


def prefill_chunks(widths: list[int]) -> list[tuple[int, int]]:
    """Row ranges [start, stop) to prefill together: consecutive rows, at most PREFILL_ROWS, and
    a new range where a row is under PREFILL_FILL of its range's widest, so little of the pass is
    padding (prompts come sorted by length, so ranges of like widths are consecutive)."""
    chunks: list[tuple[int, int]] = []
    start, widest = 0, 0
    for row, width in enumerate(widths):
        widest = max(widest, width)
        if row > start and (row - start == PREFILL_ROWS or width < PREFILL_FILL * widest):
            chunks.append((start, row))
            start, widest = row, width
    if widths:
        chunks.append((start, len(widths)))
    return chunks


@dataclass
class DecodeSlot:
    """Buffers, decode state and (CUDA) the captured step of one batch shape."""

    kv: KVBuffers
    state: DecodeState
    token: torch.Tensor  # [B] last sampled token, the next step's input
    position: torch.Tensor  # [B] its position id
    column: torch.Tensor  # [1] the row column it is written at
    sampling: SamplingParams
    graph: "torch.cuda.CUDAGraph | None" = None


class StaticDecoder:
    """Decodes batches for one loaded Llama / Qwen2 / Qwen3 model (see `decoder_stack`)."""

    def __init__(self, model: nn.Module, decoder: nn.Module, pad_id: int, stop_ids: torch.Tensor,
                 device: torch.device, prefix_sharing: bool = True,
                 cuda_graphs: bool = True) -> None:
        self.decoder, self.lm_head = decoder, model.get_output_embeddings()
        self.pad_id, self.stop_ids, self.device = pad_id, stop_ids, device
        self.prefix_sharing = prefix_sharing
        self.use_graphs = cuda_graphs and device.type == "cuda"
        config = decoder.config
        self.kv_heads = config.num_key_value_heads
        heads = config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.slots: OrderedDict[tuple, DecodeSlot] = OrderedDict()
        # Per prefix capacity: the prefix buffers every slot of that capacity shares, and what
        # they hold (tokens, weights version), so an unchanged prefix is not run again.
        self.prefixes: dict[int, tuple[KVBuffers, tuple | None]] = {}

    # ------------------------------------------------------------------ buffers and graphs

    def _slot(self, rows: int, prefix: int, width: int, sampling: SamplingParams) -> DecodeSlot:
        key = (rows, _round_up(prefix, PREFIX_BUCKET), _round_up(width, WIDTH_BUCKET),
               sampling.max_new_tokens, sampling.temperature, sampling.top_k, sampling.top_p)
        if key in self.slots:
            self.slots.move_to_end(key)
            return self.slots[key]
        while len(self.slots) >= KEEP_GRAPHS:
            self.slots.popitem(last=False)
        shared = self.prefixes.get(key[1], (None, None))[0]
        kv = KVBuffers.allocate(len(self.decoder.layers), rows, self.kv_heads, self.head_dim,
                                key[1], key[2], self.device, shared)
        if shared is None:
            self.prefixes[key[1]] = (kv.prefix_only(), None)
        state = DecodeState(rows, sampling.max_new_tokens, self.stop_ids, self.device)
        slot = DecodeSlot(kv, state, self._longs(rows), self._longs(rows), self._longs(1), sampling)
        if self.use_graphs:
            slot.graph = self._capture(slot)
        self.slots[key] = slot
        return slot

    def _longs(self, size: int) -> torch.Tensor:
        return torch.zeros(size, dtype=torch.long, device=self.device)

    def _capture(self, slot: DecodeSlot) -> "torch.cuda.CUDAGraph | None":
        """One decode step as a CUDA graph (run on placeholder state, which prefill overwrites)."""
        try:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: kernels, cuBLAS workspaces, allocator
                    self._step(slot)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._step(slot)
            return graph
        except Exception as err:  # noqa: BLE001 - any capture failure: run eager instead
            log.warning("CUDA graph capture of the decode step failed (%s): decoding eagerly; "
                        "set engine.cuda_graphs: false to skip the attempt", err)
            self.use_graphs = False
            torch.cuda.synchronize(self.device)
            return None

    # ------------------------------------------------------------------ one batch

    def decode(self, prompts: list[list[int]], sampling: SamplingParams,
               seeds: torch.Tensor) -> DecodeState:
        """Decode one batch; with graphs, the batch is padded to `row_bucket` rows by repeating
        its last prompt and seed (the extra rows' results come after the real ones)."""
        if self.use_graphs and row_bucket(len(prompts)) > len(prompts):
            extra = row_bucket(len(prompts)) - len(prompts)
            prompts = list(prompts) + [prompts[-1]] * extra
            seeds = torch.cat([seeds, seeds[-1:].expand(extra)])
        cut = shared_prefix_length(prompts) if self.prefix_sharing else 0
        tails = [p[cut:] for p in prompts]
        width_t = max(len(t) for t in tails)
        slot = self._slot(len(prompts), cut, width_t + sampling.max_new_tokens, sampling)
        logits = self._prefill(slot, prompts[0][:cut], tails)
        slot.state.reset(seeds.to(self.device))
        slot.token.copy_(slot.state.record(logits, sampling))
        slot.state.steps = 1
        if slot.graph is None and self.device.type == "cpu":
            return self._decode_dropping_rows(slot)
        every = check_interval(self.device)
        for step in range(1, sampling.max_new_tokens):
            with mark(DECODE_STEP):  # the step and, every few steps, the stop check
                if slot.graph is not None:
                    slot.graph.replay()
                else:
                    self._step(slot)
                slot.state.steps = step + 1
                if (step + 1) % every == 0 and slot.state.all_finished():
                    break
        return slot.state

    def _decode_dropping_rows(self, slot: DecodeSlot) -> DecodeState:
        """The CPU's decode loop: a step costs in proportion to its rows, and the host reads the
        stop flags every step anyway, so once a quarter of the rows have stopped they are
        dropped (their K/V copied out) and the rest decode on; a row samples what it would
        have in the whole batch (its draws depend on its seed and the step only)."""
        state, sampling = slot.state, slot.sampling
        kv, token, position = slot.kv, slot.token, slot.position
        rows = torch.arange(len(token), device=self.device)  # each decoding row's batch index
        for step in range(1, sampling.max_new_tokens):
            with mark(DECODE_STEP):
                live = ~state.finished[rows]
                alive = int(live.sum())
                if alive == 0:
                    break
                if alive <= DROP_AT * len(rows):
                    keep = live.nonzero().squeeze(1)
                    kv, rows = kv.keep_rows(keep), rows[keep]
                    token, position = token[keep], position[keep]
                new = torch.ones_like(token[:, None], dtype=torch.bool)
                hidden = forward_tokens(self.decoder, token[:, None], position[:, None],
                                        slot.column, new, kv)
                token = state.record(self.lm_head(hidden), sampling, rows)
                position = position + 1
                slot.column.add_(1)
                state.steps = step + 1
        return state

    def _prefill(self, slot: DecodeSlot, prefix: list[int], tails: list[list[int]]) -> torch.Tensor:
        """Prefix once, then the tails in row chunks; returns the logits of each prompt's last
        token and leaves position / column pointing at the first generated token."""
        kv = slot.kv
        kv.row_valid.zero_()
        capacity = kv.prefix_valid.shape[0]
        buffers, held = self.prefixes[capacity]
        holds = (tuple(prefix), weights_version([self.decoder]))
        if held != holds:  # the same tokens through the same weights are kept, not run again
            self.prefixes[capacity] = (buffers, None)  # until the pass below completes
            kv.prefix_valid.zero_()
            if prefix:
                ids = torch.tensor([prefix], dtype=torch.long, device=self.device)
                columns = torch.arange(len(prefix), device=self.device)
                forward_tokens(self.decoder, ids, columns[None], columns,
                               torch.ones_like(ids, dtype=torch.bool), kv.prefix_as_rows())
            self.prefixes[capacity] = (buffers, holds)
        ids, mask = left_pad(tails, self.pad_id, self.device)
        positions = len(prefix) + (mask.cumsum(-1) - 1).clamp(min=0)
        columns = torch.arange(ids.shape[1], device=self.device)
        logits = []
        for start, stop in prefill_chunks([len(t) for t in tails]):
            cut = ids.shape[1] - max(len(t) for t in tails[start:stop])  # the chunk's own padding
            hidden = forward_tokens(self.decoder, ids[start:stop, cut:],
                                    positions[start:stop, cut:], columns[cut:],
                                    mask[start:stop, cut:].bool(), kv.rows(start, stop))
            logits.append(self.lm_head(hidden))
        slot.position.copy_(positions[:, -1] + 1)
        slot.column.fill_(ids.shape[1])
        return torch.cat(logits)

    def _step(self, slot: DecodeSlot) -> None:
        """Feed the last tokens, sample the next ones; every input and output is a buffer."""
        hidden = forward_tokens(self.decoder, slot.token[:, None], slot.position[:, None],
                                slot.column, torch.ones_like(slot.token[:, None], dtype=torch.bool),
                                slot.kv)
        slot.token.copy_(slot.state.record(self.lm_head(hidden), slot.sampling))
        slot.position.add_(1)
        slot.column.add_(1)
