"""``BatchStats``: samples, real tokens and packing efficiency of one batch (what the rank metrics record)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class BatchStats:
    """Source samples, real (non-pad) tokens and, for packed batches, real tokens / capacity.

    ``zero_loss_samples``: samples with ``loss_multiplier`` 0 (cut to stubs for being over
    length), counted in ``samples`` too: they are handed out but train nothing.
    """

    samples: int
    non_pad_tokens: int
    packing_efficiency: Optional[float]
    zero_loss_samples: int = 0


def batch_stats(batch: Any) -> BatchStats:
    """Stats of one SFT or preference batch, packed (``packing_metrics``) or not (message logs).

    Unpacked: one sample per row, tokens are every message's ``token_ids`` in every
    ``message_log*`` column (so chosen and rejected both count), or, for padded training
    tensors, ``input_lengths``.
    """
    if "packing_metrics" in batch:
        packs = batch["packing_metrics"]
        tokens = sum(int(p["tokens"]) for p in packs)
        capacity = sum(int(p["capacity"]) for p in packs)
        return BatchStats(
            samples=sum(int(p["num_sequences"]) for p in packs),
            non_pad_tokens=tokens,
            packing_efficiency=tokens / capacity if capacity else 0.0,
            zero_loss_samples=sum(int(p.get("zero_loss_sequences", 0)) for p in packs),
        )
    columns = [key for key in batch if key.startswith("message_log")]
    multipliers = batch.get("loss_multiplier")
    zero_loss = int((multipliers == 0).sum()) if multipliers is not None else 0
    if not columns and "input_lengths" in batch:
        lengths = batch["input_lengths"]
        return BatchStats(
            samples=int(lengths.numel()), non_pad_tokens=int(lengths.sum()), packing_efficiency=None, zero_loss_samples=zero_loss
        )
    if not columns:
        raise ValueError(
            f"cannot measure a batch with keys {sorted(batch)}; expected 'packing_metrics' "
            "(packed SFT), 'message_log*' columns (unpacked SFT, preference) or 'input_lengths' (padded "
            "unpacked SFT)"
        )
    tokens = sum(int(m["token_ids"].numel()) for key in columns for log in batch[key] for m in log)
    return BatchStats(
        samples=len(batch[columns[0]]), non_pad_tokens=tokens, packing_efficiency=None, zero_loss_samples=zero_loss
    )
