"""Media placeholder tokens: a tokenizer copy that knows the image, video and audio placeholders.

A multimodal sample's text holds one run of placeholder tokens per media item, which the model
replaces with the item's embeddings: ``<|vision_start|>`` + ``<|image_pad|>`` x n +
``<|vision_end|>`` for an image (``<|video_pad|>`` for a video, Qwen2-VL names) and
``<|audio_start|>`` + ``<|audio_pad|>`` x n + ``<|audio_end|>`` for an audio clip (Qwen2.5-Omni
names). :func:`with_media_tokens` returns a *copy* of a tokenizer with the missing ones added
as special tokens; tokens it already has keep their ids (the Qwen3 tokenizer ships the vision
tokens at their official ids 151652-151656), and the original tokenizer is never changed.
"""

from __future__ import annotations

import copy
from typing import Any

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
AUDIO_START = "<|audio_start|>"
AUDIO_END = "<|audio_end|>"
AUDIO_PAD = "<|audio_pad|>"

#: Every placeholder token, in the order they are added when missing.
MEDIA_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD, AUDIO_START, AUDIO_END, AUDIO_PAD)
#: The tokens repeated once per embedding (replaced by media in the model).
MEDIA_PAD_TOKENS = (IMAGE_PAD, VIDEO_PAD, AUDIO_PAD)


def missing_media_tokens(tokenizer: Any) -> list[str]:
    """The placeholder tokens ``tokenizer`` does not have as single tokens."""
    vocab = tokenizer.get_vocab()
    return [token for token in MEDIA_TOKENS if token not in vocab]


def with_media_tokens(tokenizer: Any) -> Any:
    """A copy of ``tokenizer`` with every missing placeholder token added as a special token.

    Existing ids are unchanged; new tokens get the next free ids in :data:`MEDIA_TOKENS` order.
    The copy's ``name_or_path`` is the original's.
    """
    from tokenizers import AddedToken

    extended = copy.deepcopy(tokenizer)
    missing = missing_media_tokens(extended)
    if missing:
        extended.add_tokens(
            [AddedToken(token, special=True, normalized=False) for token in missing],
            special_tokens=True,
        )
    return extended


def media_token_ids(tokenizer: Any) -> dict[str, int]:
    """Placeholder token -> id; ``ValueError`` naming the missing tokens and the fix."""
    missing = missing_media_tokens(tokenizer)
    if missing:
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} is text-only: it has no "
            f"media placeholder tokens {missing}; pass with_media_tokens(tokenizer) (a copy "
            "with the placeholders added) to the multimodal processor"
        )
    return {token: tokenizer.convert_tokens_to_ids(token) for token in MEDIA_TOKENS}
