"""How image features reach a causal LM: a forward hook on its token embedding replaces the
embeddings of image placeholder positions with the features, for the one input it is told about.

Why a hook: engine prefill, the trainer's shared trunk, each branch (actor, reference, critic)
and the critic's own forward all embed through `embed_tokens`; hooking it serves them all without
a second code path per model. The hook acts only on a call whose input ids equal the ids given to
`images_context` (so decode steps and other calls in the same scope are left alone), and the mask
is explicit, so a placeholder id the model itself sampled is embedded as a token, never as an
image.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import torch
from torch import nn

_ACTIVE: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
_HOOKED = "_longturn_image_hook"


def _inject(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
    ids = args[0] if args else None
    if ids is None:
        return None
    for want, mask, features in reversed(_ACTIVE):
        if want.shape == ids.shape and want.device == ids.device and torch.equal(want, ids):
            return output.masked_scatter(mask[..., None].to(output.device),
                                         features.to(device=output.device, dtype=output.dtype))
    return None


def attach(model: nn.Module) -> None:
    """Hook every token embedding (`*embed_tokens`) of `model`, once."""
    found = False
    for name, module in model.named_modules():
        if name.endswith("embed_tokens") and isinstance(module, nn.Embedding):
            found = True
            if not getattr(module, _HOOKED, False):
                module.register_forward_hook(_inject)
                setattr(module, _HOOKED, True)
    if not found:
        raise ValueError(f"{type(model).__name__} has no embed_tokens to feed images into")


RowImages = Sequence[tuple[int, Any]]  # one row's (placeholder start, RGB frame) pairs


def has_images(images: Sequence[RowImages] | None) -> bool:
    """Whether any row has a frame (then no prompt prefix may be shared: identical placeholder
    ids can stand for different frames)."""
    return bool(images) and any(images)


@contextmanager
def images_context(vision: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   images: Sequence[RowImages] | None) -> Iterator[None]:
    """Within the block, embedding `input_ids` (a left-padded batch, `attention_mask` over the
    same columns: each row's first real column places its tokens) puts its rows' frames'
    features, encoded in one pass, at their placeholder positions. A no-op without images."""
    if not has_images(images):
        yield
        return
    if vision is None:
        raise ValueError("the batch has image observations but the model has no image side "
                         "(no vision/ in its model dir)")
    if attention_mask.shape != input_ids.shape:
        raise ValueError("a batch with images cannot share a prompt prefix: pack it without one")
    offsets = attention_mask.long().argmax(dim=1).tolist()  # the first real column of each row
    mask = torch.zeros_like(input_ids, dtype=torch.bool)  # True at every image's placeholders
    for i, (offset, row) in enumerate(zip(offsets, images)):
        for start, _ in row:
            mask[i, offset + start: offset + start + vision.tokens_per_image] = True
    features = vision.encode([frame for row in images for _, frame in row])
    if int(mask.sum()) != features.shape[0]:
        raise ValueError(f"{int(mask.sum())} image positions but {features.shape[0]} features")
    _ACTIVE.append((input_ids, mask, features))
    try:
        yield
    finally:
        _ACTIVE.pop()
