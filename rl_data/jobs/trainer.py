"""Simple training actors: one per DP rank, each consuming its rank's batch by reference.

A ``TrainingActor`` receives the batch's ObjectRef (wrapped in a list, so Ray does not resolve
it on the way), fetches it from the object store and moves it to its device with
:func:`rl_data.distributed.transfer.batch_to_device`. SFT batches arrive as padded training
tensors (``data_config["batch_format"]="tensors"``, the default) or packed, and are used as
they are; a batch that carries message logs (``batch_format="message_log"``, or a preference
batch: chosen rows, then rejected rows) is masked (assistant turns trained) and flattened into
``input_ids`` / ``token_mask`` here, as an SFT trainer does (a multimodal batch's media stay in
its ``get_multimodal_dict``).
Then it runs a tiny, real forward pass: a bucketed embedding + linear next-token model (fixed
seed, no updates) whose masked cross-entropy uses exactly the tokens the loss mask trains on.
It reports what it consumed (sample ids, tokens, loss), which is what the job's exactness proof
compares.
"""

from __future__ import annotations

from typing import Any

#: Token ids are hashed into this many buckets (keeps the toy model small for any vocabulary).
BUCKETS = 1024
EMBED_DIM = 32


class TrainingActor:
    """The training side of one DP rank (run as a Ray actor)."""

    def __init__(self, rank: int, pad_token_id: int, seed: int = 0) -> None:
        import torch

        from rl_data.distributed.transfer import default_device

        self.rank, self.pad_token_id = rank, pad_token_id
        self.device = default_device()
        generator = torch.Generator().manual_seed(seed)
        self._embedding = torch.randn(BUCKETS, EMBED_DIM, generator=generator).to(self.device)
        self._output = (torch.randn(EMBED_DIM, BUCKETS, generator=generator) / EMBED_DIM**0.5).to(self.device)

    def describe(self) -> dict[str, Any]:
        """Rank, device and the GPUs Ray assigned to this actor."""
        import ray

        return {"rank": self.rank, "device": str(self.device), "gpu_ids": ray.get_gpu_ids()}

    def train_step(self, step: int, batch_ref: list[Any], timeout_s: float = 300.0) -> dict[str, Any]:
        """Fetch ``batch_ref[0]``, run the forward pass; return what was consumed."""
        import time

        import torch

        from rl_data.batch_stats import batch_stats
        from rl_data.distributed.transfer import fetch_batch

        started = time.perf_counter()
        batch = fetch_batch(batch_ref[0], self.device, timeout=timeout_s)
        flat = batch if "input_ids" in batch else self._flatten(batch)
        input_ids, token_mask = flat["input_ids"], flat["token_mask"]
        with torch.no_grad():
            hidden = self._embedding[input_ids[:, :-1] % BUCKETS]
            logits = hidden @ self._output
            targets = input_ids[:, 1:] % BUCKETS
            weights = token_mask[:, 1:].to(logits.dtype)
            losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
            loss = float((losses * weights).sum() / weights.sum().clamp(min=1))
        packs = batch.get("packing_metrics")
        if packs:
            tokens = sum(int(p["tokens"]) for p in packs)
            capacity = sum(int(p["capacity"]) for p in packs)
        else:
            tokens, capacity = int(flat["input_lengths"].sum()), 0
        return {
            "rank": self.rank,
            "step": step,
            "source_ids": [list(ids) if isinstance(ids, (list, tuple)) else ids for ids in batch["source_ids"]],
            "tokens": tokens,
            "trained_tokens": int(token_mask.sum()),
            "zero_loss_samples": batch_stats(batch).zero_loss_samples,
            "pack_capacity": capacity,
            "loss": loss,
            "seconds": time.perf_counter() - started,
        }

    def _flatten(self, batch: Any) -> Any:
        """Loss masks on the message logs (assistant tokens trained), then the padded SFT tensors.

        A preference batch becomes its chosen rows followed by its rejected rows, as a DPO
        trainer's forward pass sees them.
        """
        from rl_data.tokenization.flatten import sft_batch_tensors
        from rl_data.tokenization.loss_mask import add_loss_mask_to_message_log

        multipliers = batch["loss_multiplier"].tolist()
        if "message_log_chosen" in batch:
            logs, multipliers = batch["message_log_chosen"] + batch["message_log_rejected"], multipliers * 2
        else:
            logs = batch["message_log"]
        add_loss_mask_to_message_log(logs, roles_to_train_on=("assistant",))
        return sft_batch_tensors(logs, multipliers, pad_token_id=self.pad_token_id)


def start_trainers(ranks: int, *, pad_token_id: int, num_gpus: float, namespace: str, name_prefix: str) -> list[Any]:
    """One named ``TrainingActor`` per rank (``<name_prefix>.trainer<r>``), on GPU when ``num_gpus``."""
    import ray

    from rl_data.jobs.config import TRAINER_CPUS

    actor = ray.remote(TrainingActor)
    return [
        actor.options(
            name=f"{name_prefix}.trainer{rank}",
            namespace=namespace,
            num_gpus=num_gpus,
            num_cpus=0 if num_gpus else TRAINER_CPUS,
            max_restarts=0,
        ).remote(rank, pad_token_id)
        for rank in range(ranks)
    ]
