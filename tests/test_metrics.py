"""Ray metrics: batch stats, and the exact values the node's Prometheus endpoint exports.

The metrics only an Energon rank produces (packing, skipped bad samples) are read from an Energon run;
the coordinator's counts of restores run on the synthetic task (:data:`SYNTHETIC_SPEC`: the same
coordinator, rank actors and rank metrics over loaders that import no torch, tokenizer or Energon,
a fifth of an Energon rank's start).
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from typing import Any

import pytest
import torch

from distributed_fixtures import (
    TIMEOUT_S,
    running_coordinator,
    runtime_config,
    synthetic_reference_stream,
    train_spec,
)
from rl_data.batched_data_dict import BatchedDataDict
from rl_data.batch_stats import BatchStats, batch_stats
from rl_data.distributed.checkpoint_files import pickled_size
from rl_data.distributed.placement import config_layout, placement_fingerprint
from rl_data.tasks.synthetic import synthetic_loader_spec

#: Metrics reach the endpoint within one or two of Ray's 10 s report intervals (ray_session).
SCRAPE_TIMEOUT_S = 60.0
#: 3 batches of 2 samples per pass (7 samples a rank, one dropped per pass), 8 tokens a sample.
SYNTHETIC_SPEC = synthetic_loader_spec(batch_size=2, samples_per_rank=7, tokens_per_sample=8, name="metrics-synthetic")


def _message(tokens: int) -> dict[str, Any]:
    return {"role": "user", "content": "", "token_ids": torch.arange(tokens)}


def test_batch_stats_of_unpacked_sft_and_preference_batches():
    sft = BatchedDataDict(message_log=[[_message(3), _message(5)], [_message(7)]], loss_multiplier=torch.ones(2))
    assert batch_stats(sft) == BatchStats(samples=2, non_pad_tokens=15, packing_efficiency=None)
    preference = BatchedDataDict(
        message_log_chosen=[[_message(2), _message(4)]],
        message_log_rejected=[[_message(2), _message(1)]],
        loss_multiplier=torch.ones(1),
    )
    assert batch_stats(preference) == BatchStats(samples=1, non_pad_tokens=9, packing_efficiency=None)
    truncated = BatchedDataDict(message_log=[[_message(4)], [_message(2)], [_message(3)]], loss_multiplier=torch.tensor([1.0, 0.0, 0.0]))
    assert batch_stats(truncated) == BatchStats(samples=3, non_pad_tokens=9, packing_efficiency=None, zero_loss_samples=2)
    padded = BatchedDataDict(
        input_ids=torch.zeros(3, 8), input_lengths=torch.tensor([8, 5, 2], dtype=torch.int32), loss_multiplier=torch.tensor([1.0, 1.0, 0.0])
    )
    assert batch_stats(padded) == BatchStats(samples=3, non_pad_tokens=15, packing_efficiency=None, zero_loss_samples=1)
    with pytest.raises(
        ValueError,
        match=r"cannot measure a batch with keys \['input_ids'\]; expected 'packing_metrics' \(packed SFT\), 'message_log\*' columns",
    ):
        batch_stats(BatchedDataDict(input_ids=torch.zeros(2, 3)))


def _scrape(port: int) -> list[Any]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def _wait_for_metrics(port: int, expected: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict:
    """``{(sample name, sorted label subset): value summed over workers}`` once it equals
    ``expected`` (or after SCRAPE_TIMEOUT_S, for the caller's assertion to show the difference)."""
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    while True:
        samples = _scrape(port)
        observed = {key: _value(samples, key) for key in expected}
        if observed == expected or time.monotonic() > deadline:
            return observed
        time.sleep(0.5)


def _value(samples: list[Any], key: tuple[str, tuple[tuple[str, str], ...]]) -> float | None:
    """The sum over workers of the samples named ``key[0]`` with labels ``key[1]``; None if absent."""
    values = [s.value for s in samples if s.name == key[0] and set(key[1]) <= set(s.labels.items())]
    return sum(values) if values else None


def _key(name: str, **labels: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted((k, str(v)) for k, v in labels.items()))


def _wait_until_prefetched(ray: Any, coordinator: Any, depth: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        ranks = ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)["ranks"]
        if all(r["ready"] == depth for r in ranks):
            return
        time.sleep(0.1)
    raise AssertionError(f"ranks did not prefetch {depth} batches within {TIMEOUT_S} s: {ranks}")


def _skipped_after(spec: Any, config: Any, tokenizer: Any, batches: int) -> list[int]:
    """Per rank: the bad samples an uninterrupted loader skipped producing ``batches`` batches."""
    from rl_data.energon.sft_dataloader import build_energon_sft_loader

    fingerprint = placement_fingerprint(config_layout(config))
    skipped = []
    for rank in range(config.world_size):
        loader = build_energon_sft_loader(
            **spec.builder_kwargs(),
            processor=tokenizer,
            logical_rank=rank,
            logical_world_size=config.world_size,
            placement_fingerprint=fingerprint,
        )
        iterator = iter(loader)
        for _ in range(batches):
            next(iterator)  # 5-batch virtual epochs: callers stay below that
        skipped.append(loader.skipped_samples)
    return skipped


def test_rank_and_coordinator_metrics_of_a_packed_run(ray_session, metrics_port, corrupt_energon_dataset, tokenizer):
    ray, name, steps, depth, capacity = ray_session, f"metrics_{uuid.uuid4().hex[:8]}", 3, 1, 1024
    spec = train_spec(
        corrupt_energon_dataset,
        data_config={"energon": {"shuffle_buffer_size": 20, "max_samples_per_sequence": 10, "packing_buffer_size": 8}, "shuffle": True},
        packing_algorithm="first_fit_decreasing",
        max_sequence_length=capacity,
    )
    config = runtime_config(2, depth, name=name)
    skipped = _skipped_after(spec, config, tokenizer, steps + depth)
    assert skipped == [2, 1]  # the corrupt samples sit in the first shuffle buffer of each rank
    batches: list[list[Any]] = []
    with running_coordinator(ray, config, spec) as coordinator:
        started = time.monotonic()
        for _ in range(steps):
            step, refs = ray.get(coordinator.next_step.remote(), timeout=TIMEOUT_S)
            batches.append(ray.get(refs, timeout=TIMEOUT_S))
            ray.get(coordinator.commit.remote(step), timeout=TIMEOUT_S)
        elapsed = time.monotonic() - started
        _wait_until_prefetched(ray, coordinator, depth)

        expected = {
            _key("ray_rl_data_coordinator_steps_total", coordinator=name): steps,
            _key("ray_rl_data_coordinator_step_latency_seconds_count", coordinator=name): steps,
            _key("ray_rl_data_coordinator_committed_step", coordinator=name): steps,
        }
        for rank in range(2):
            mine = [step_batches[rank] for step_batches in batches]
            tokens = [sum(int(c[-1]) for c in b["cu_seqlens"].tensors) for b in mine]
            expected |= {
                _key("ray_rl_data_rank_batches_total", coordinator=name, rank=rank): steps,
                _key("ray_rl_data_rank_samples_total", coordinator=name, rank=rank): sum(len(ids) for b in mine for ids in b["source_ids"]),
                _key("ray_rl_data_rank_non_pad_tokens_total", coordinator=name, rank=rank): sum(tokens),
                _key("ray_rl_data_rank_packing_efficiency", coordinator=name, rank=rank): tokens[-1] / (capacity * len(mine[-1]["source_ids"])),
                _key("ray_rl_data_rank_skipped_samples_total", coordinator=name, rank=rank): skipped[rank],
                _key("ray_rl_data_rank_prefetch_depth", coordinator=name, rank=rank): depth,
            }
        assert _wait_for_metrics(metrics_port, expected) == expected
        samples = _scrape(metrics_port)  # blocked time is recorded with the batch counts
        for rank in range(2):
            blocked = _value(samples, _key("ray_rl_data_rank_blocked_seconds_total", coordinator=name, rank=rank))
            assert 0 < blocked < elapsed  # the first batch is always waited for


@pytest.mark.timeout(180)
def test_checkpoint_loads_and_rank_recoveries_are_counted(ray_session, metrics_port, tmp_path):
    """On the synthetic task (the subject is the coordinator's count of restores; its ranks count
    batches, samples and tokens as an Energon rank does, :func:`test_rank_and_coordinator_metrics_of_a_packed_run`)."""
    ray, name = ray_session, f"metrics_{uuid.uuid4().hex[:8]}"
    config = runtime_config(2, 1, name=name)
    reference = synthetic_reference_stream(SYNTHETIC_SPEC, config, 2)
    taken, rank1_batches = [], []
    with running_coordinator(ray, config, SYNTHETIC_SPEC) as coordinator:
        ray.get(coordinator.save_checkpoint.remote(str(tmp_path)), timeout=TIMEOUT_S)
        assert ray.get(coordinator.load_checkpoint.remote(str(tmp_path)), timeout=TIMEOUT_S) == 0
        for kill_rank_0 in (False, True):
            if kill_rank_0:
                rank_0 = ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)["rank_actor_names"][0]
                ray.kill(ray.get_actor(rank_0, namespace="rl_data_tests"), no_restart=True)
            step, refs = ray.get(coordinator.next_step.remote(), timeout=TIMEOUT_S)
            batches = ray.get(refs, timeout=TIMEOUT_S)
            taken.append([list(batch["source_ids"]) for batch in batches])
            rank1_batches.append(batches[1])
            ray.get(coordinator.commit.remote(step), timeout=TIMEOUT_S)
        assert ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)["restarts"] == [1, 0]
        assert taken == reference  # the recovered rank 0 went on exactly

        tokens = sum(len(ids) for b in rank1_batches for ids in b["token_ids"])
        expected = {
            _key("ray_rl_data_coordinator_restores_total", coordinator=name, kind="checkpoint"): 1,
            _key("ray_rl_data_coordinator_restores_total", coordinator=name, kind="rank_recovery"): 1,
            _key("ray_rl_data_coordinator_steps_total", coordinator=name): 2,
            _key("ray_rl_data_coordinator_committed_step", coordinator=name): 2,
            _key("ray_rl_data_rank_batches_total", coordinator=name, rank=1): 2,
            _key("ray_rl_data_rank_samples_total", coordinator=name, rank=1): 2 * SYNTHETIC_SPEC.batch_size,
            _key("ray_rl_data_rank_non_pad_tokens_total", coordinator=name, rank=1): tokens,
            _key("ray_rl_data_rank_packing_efficiency", coordinator=name, rank=1): None,  # not packed: never set
            _key("ray_rl_data_coordinator_checkpoint_seconds_count", coordinator=name): 1,  # save_checkpoint
        }
        assert _wait_for_metrics(metrics_port, expected) == expected
        size = _value(_scrape(metrics_port), _key("ray_rl_data_coordinator_checkpoint_bytes", coordinator=name))
        origin = pickled_size(ray.get(coordinator.origin_state_dict.remote(), timeout=TIMEOUT_S))  # what was saved
        assert size is not None and 0.9 * origin <= size <= 1.1 * origin, (size, origin)
