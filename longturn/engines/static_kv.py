"""Fixed-size KV buffers for one decode batch, and the decoder-layer forward that writes them.

Layout per layer: the prompts' shared prefix (system prompt + worked examples, most of every
agent prompt) is stored ONCE, [Hkv, Cp, D]; each row's own columns (left-padded prompt tail, then
generated tokens) are [B, Hkv, L, D]. Attention of a query is a softmax over both parts ("cascade"
attention): the prefix part is one matrix product shared by the whole batch, so a decode step
reads the prefix keys once instead of once per row. K/V are kept in float32 (they are bf16 values
from the projections, so nothing is lost) and attention is computed in float32, like the fused
kernels do internally.

Every size is fixed when the buffers are allocated and every position a step writes is an index
tensor on the device, so a decode step has static shapes and no host synchronisation (a CUDA
graph can capture it).

The layer forward calls the model's own modules (norms, projections, MLP, rotary embedding) in the
order Llama / Qwen2 / Qwen3 decoder layers do; tests compare its logits with the model's forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb


FUSED_PREFILL = True  # CPU prefill attention by the fused kernel (`fused_attention`)


@dataclass
class KVBuffers:
    """K/V of one batch: the shared prefix once, then every row's own columns."""

    prefix_k: list[torch.Tensor]  # per layer [Hkv, Cp, D] float32
    prefix_v: list[torch.Tensor]
    prefix_valid: torch.Tensor  # [Cp] bool
    row_k: list[torch.Tensor]  # per layer [B, Hkv, L, D] float32
    row_v: list[torch.Tensor]
    row_valid: torch.Tensor  # [B, L] bool: a real token has been written at this column

    @classmethod
    def allocate(cls, layers: int, rows: int, kv_heads: int, head_dim: int, prefix: int,
                 width: int, device: torch.device,
                 shared: "KVBuffers | None" = None) -> "KVBuffers":
        """Zeroed buffers; with `shared`, its prefix buffers are used (not copied) instead of
        new ones, so batches of other row counts reuse a prefix already written."""
        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=torch.float32, device=device)

        if shared is not None:
            prefix_k, prefix_v, prefix_valid = shared.prefix_k, shared.prefix_v, shared.prefix_valid
        else:
            prefix_k = [zeros(kv_heads, prefix, head_dim) for _ in range(layers)]
            prefix_v = [zeros(kv_heads, prefix, head_dim) for _ in range(layers)]
            prefix_valid = torch.zeros(prefix, dtype=torch.bool, device=device)
        return cls(prefix_k, prefix_v, prefix_valid,
                   [zeros(rows, kv_heads, width, head_dim) for _ in range(layers)],
                   [zeros(rows, kv_heads, width, head_dim) for _ in range(layers)],
                   torch.zeros(rows, width, dtype=torch.bool, device=device))

    def rows(self, start: int, stop: int) -> "KVBuffers":
        """The same buffers restricted to rows [start, stop) (views: writes land in place)."""
        return KVBuffers(self.prefix_k, self.prefix_v, self.prefix_valid,
                         [k[start:stop] for k in self.row_k], [v[start:stop] for v in self.row_v],
                         self.row_valid[start:stop])

    def prefix_only(self) -> "KVBuffers":
        """The prefix buffers with no rows: what other slots share, without keeping this slot's
        row buffers alive once the slot is dropped."""
        return KVBuffers(self.prefix_k, self.prefix_v, self.prefix_valid, [], [],
                         self.row_valid[:0])

    def keep_rows(self, keep: torch.Tensor) -> "KVBuffers":
        """Copies of the rows at `keep` (the prefix stays shared): a smaller batch to decode on."""
        return KVBuffers(self.prefix_k, self.prefix_v, self.prefix_valid,
                         [k.index_select(0, keep) for k in self.row_k],
                         [v.index_select(0, keep) for v in self.row_v],
                         self.row_valid.index_select(0, keep))

    def prefix_as_rows(self) -> "KVBuffers":
        """The prefix buffers seen as one row with no prefix of its own (the prefix pass)."""
        empty = [k[:, :0] for k in self.prefix_k]
        return KVBuffers(empty, empty, self.prefix_valid[:0], [k[None] for k in self.prefix_k],
                         [v[None] for v in self.prefix_v], self.prefix_valid[None])


def cascade_attention(q: torch.Tensor, layer: int, kv: KVBuffers, visible: torch.Tensor,
                      scaling: float) -> torch.Tensor:
    """softmax(q·K / √d) V over the prefix columns and the row's own visible columns.

    q [B, H, T, D] float32; visible [B, T, L]; returns [B, H, T, D] float32."""
    rows, heads, width_t, dim = q.shape
    kv_heads = kv.row_k[layer].shape[1]
    group = heads // kv_heads
    qg = q.reshape(rows, kv_heads, group * width_t, dim)
    own = torch.matmul(qg, kv.row_k[layer].transpose(-1, -2)) * scaling  # [B, Hkv, G*T, L]
    own = own.view(rows, kv_heads, group, width_t, -1)
    own = own.masked_fill(~visible[:, None, None], float("-inf"))
    prefix_width = kv.prefix_k[layer].shape[1]
    if prefix_width == 0:
        probs = own.softmax(-1).view(rows, kv_heads, group * width_t, -1)
        out = torch.matmul(probs, kv.row_v[layer])
        return out.view(rows, heads, width_t, dim)
    flat = qg.transpose(0, 1).reshape(kv_heads, rows * group * width_t, dim)
    shared = torch.matmul(flat, kv.prefix_k[layer].transpose(-1, -2)) * scaling  # [Hkv, N, Cp]
    shared = shared.view(kv_heads, rows, group, width_t, prefix_width).transpose(0, 1)
    shared = shared.masked_fill(~kv.prefix_valid, float("-inf"))
    probs = torch.cat([shared, own], dim=-1).softmax(-1)
    p_shared, p_own = probs[..., :prefix_width], probs[..., prefix_width:]
    out = torch.matmul(p_own.reshape(rows, kv_heads, group * width_t, -1), kv.row_v[layer])
    p_flat = p_shared.transpose(0, 1).reshape(kv_heads, rows * group * width_t, prefix_width)
    out_shared = torch.matmul(p_flat, kv.prefix_v[layer])  # [Hkv, N, D]
    out = out + out_shared.view(kv_heads, rows, group * width_t, dim).transpose(0, 1)
    return out.view(rows, heads, width_t, dim)


def fused_attention(q: torch.Tensor, layer: int, kv: KVBuffers, visible: torch.Tensor,
                    scaling: float) -> torch.Tensor:
    """The same softmax over prefix and own columns as `cascade_attention`, by torch's fused
    kernel on keys with the prefix repeated per row. For a CPU prefill: there the fused kernel
    is ~4x the unfused products (it never holds the [rows, heads, T, keys] scores), while copying
    the prefix per row costs little; a decode step (T = 1) is faster as the cascade."""
    rows, _, width_t, _ = q.shape
    keys, values, mask = kv.row_k[layer], kv.row_v[layer], visible
    if kv.prefix_k[layer].shape[1]:
        keys = torch.cat([kv.prefix_k[layer].expand(rows, -1, -1, -1), keys], dim=2)
        values = torch.cat([kv.prefix_v[layer].expand(rows, -1, -1, -1), values], dim=2)
        mask = torch.cat([kv.prefix_valid.expand(rows, width_t, -1), visible], dim=-1)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None],
                                          scale=scaling, enable_gqa=True)


def visibility(kv: KVBuffers, columns: torch.Tensor) -> torch.Tensor:
    """[B, T, L]: key column j is visible to the query written at column c when j holds a real
    token and j <= c; a query always sees its own column (a pad query then has a finite row)."""
    keys = torch.arange(kv.row_valid.shape[1], device=columns.device)
    causal = keys[None, None, :] <= columns[None, :, None]
    own = keys[None, None, :] == columns[None, :, None]
    return (kv.row_valid[:, None, :] & causal) | own


def attention_block(attn: nn.Module, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                    layer: int, kv: KVBuffers, columns: torch.Tensor,
                    new_valid: torch.Tensor) -> torch.Tensor:
    """The self-attention of one decoder layer on x [B, T, H]: writes this chunk's K/V at
    `columns` [T] (marking `new_valid` [B, T] real), then attends; returns the o_proj output."""
    rows, width_t, _ = x.shape
    shape = (rows, width_t, -1, attn.head_dim)
    q, k, v = attn.q_proj(x).view(shape), attn.k_proj(x).view(shape), attn.v_proj(x).view(shape)
    if hasattr(attn, "q_norm"):  # Qwen3 normalises q and k per head before the rotation
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    cos, sin = rotary
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    kv.row_k[layer].index_copy_(2, columns, k.float())
    kv.row_v[layer].index_copy_(2, columns, v.float())
    kv.row_valid.index_copy_(1, columns, new_valid)
    fused = FUSED_PREFILL and width_t > 1 and x.device.type == "cpu"
    attend = fused_attention if fused else cascade_attention
    out = attend(q.float(), layer, kv, visibility(kv, columns), attn.scaling)
    out = out.to(x.dtype).transpose(1, 2).reshape(rows, width_t, -1)
    return attn.o_proj(out)


def forward_tokens(decoder: nn.Module, ids: torch.Tensor, positions: torch.Tensor,
                   columns: torch.Tensor, new_valid: torch.Tensor, kv: KVBuffers) -> torch.Tensor:
    """Every decoder layer over ids [B, T] at `positions` [B, T], K/V written at `columns`;
    returns the final-normed hidden state of the last column, [B, H]."""
    hidden = decoder.embed_tokens(ids)
    rotary = decoder.rotary_emb(hidden, positions)
    for index, layer in enumerate(decoder.layers):
        residual = hidden
        hidden = attention_block(layer.self_attn, layer.input_layernorm(hidden), rotary, index,
                                 kv, columns, new_valid)
        hidden = residual + hidden
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return decoder.norm(hidden[:, -1])
