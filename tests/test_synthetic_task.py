"""The synthetic task (``rl_data.tasks.synthetic``): its loader restores exactly; through the real
coordinator and prompt feed it rewinds at every step, a killed rank is replaced exactly, and a rank
process imports neither torch nor a tokenizer library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from distributed_fixtures import (
    TIMEOUT_S,
    running_coordinator,
    runtime_config,
    shut_down,
    wait_for,
)
from restore_check import assert_restores_at_every_step, assert_rewinds_at_every_step

from rl_data.distributed.client import CoordinatorClient
from rl_data.distributed.placement import config_layout, placement_fingerprint
from rl_data.distributed.rank_actor import loader_builder
from rl_data.tasks.synthetic import load_stub_tokenizer, synthetic_loader_spec

# 3 batches per pass (7 samples, batches of 2: one dropped per pass), so 7 steps cross two pass ends
SPEC = synthetic_loader_spec(batch_size=2, samples_per_rank=7, tokens_per_sample=5, name="synthetic-test")
STEPS = 7


def _loader(rank: int = 0, world: int = 2, spec=SPEC):
    return loader_builder(spec)(spec, load_stub_tokenizer(), logical_rank=rank, logical_world_size=world, placement_fingerprint="fp")


def _extract(batch):
    return batch["source_ids"], {"token_ids": torch.tensor([list(ids) for ids in batch["token_ids"]])}


def _reference(config, steps: int) -> list[list[list[str]]]:
    """``[step][rank] -> ids`` of each rank's loader run directly, passes continued as a rank actor does."""
    fingerprint = placement_fingerprint(config_layout(config))
    per_rank = []
    for rank in range(config.world_size):
        loader = loader_builder(SPEC)(SPEC, load_stub_tokenizer(), logical_rank=rank,
                                       logical_world_size=config.world_size, placement_fingerprint=fingerprint)  # fmt: skip
        batches: list[list[str]] = []
        while len(batches) < steps:
            batches += [list(batch["source_ids"]) for batch in loader]
        per_rank.append(batches[:steps])
    return [[per_rank[r][s] for r in range(config.world_size)] for s in range(steps)]


def test_the_loader_restores_exactly_after_every_batch_across_passes():
    report = assert_restores_at_every_step(_loader, steps=8, extract=_extract)
    assert report.epoch_starts == [3, 6]
    ids, rank_samples = report.ids, {f"synthetic-{i}" for i in range(7)}
    for one_pass in (ids[:6], ids[6:12]):  # 6 of the rank's 7 samples, each once (one dropped)
        assert len(set(one_pass)) == 6 and set(one_pass) <= rank_samples
    assert ids[:6] != ids[6:12]  # a new order per pass


def test_the_loader_refuses_another_shard_a_started_loader_and_bad_specs():
    state = _loader(rank=1).state_dict()
    with pytest.raises(ValueError, match=r"identity changed: topology.logical_rank 1 -> 0"):
        _loader(rank=0).load_state_dict(state)
    with pytest.raises(ValueError, match=r"reweight=True: a synthetic source has no mixture weights"):
        _loader(rank=1).load_state_dict(state, reweight=True)
    started = _loader(rank=1)
    next(iter(started))
    with pytest.raises(RuntimeError, match=r"restore after iteration started"):
        started.load_state_dict(state)
    virtual = SPEC.model_copy(update={"source": SPEC.source.model_copy(update={"epoch_mode": "virtual", "virtual_epoch_length": 3})})
    with pytest.raises(ValueError, match=r"epoch_mode 'virtual' and virtual_epoch_length 3, expected a path"):
        _loader(spec=virtual)
    with pytest.raises(ValueError, match=r"samples_per_rank 1 is below batch_size 2"):
        _loader(spec=synthetic_loader_spec(batch_size=2, samples_per_rank=1))


def test_a_task_named_by_import_path_imports_no_builtin_task():
    code = (
        "import sys; from rl_data.task_registry import get_task\n"
        "for _ in range(2): get_task('rl_data.tasks.synthetic:TASK')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('rl_data.tasks.') or m.split('.')[0] in ('torch', 'megatron', 'transformers'))\n"
        "assert loaded == ['rl_data.tasks.synthetic'], loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _rank_libraries(pid: int) -> list[str]:
    """Shared libraries of torch and tokenizers mapped into process ``pid``."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return sorted({line.split()[-1] for line in maps.splitlines() if "/torch/" in line or "tokenizers" in line})


def _ray_warned_of_a_blocking_get(ray, pid: int) -> bool:
    """Whether the actor process ``pid`` logged Ray's "blocking ray.get inside async actor" warning
    (the coordinator and the feed call ``ray.get`` in worker threads only: the warning is wrong there)."""
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    files = list(logs.glob(f"worker-*-{pid}.err"))
    assert files, f"no log of process {pid} in {logs}"
    return any("blocking ray.get inside async actor" in path.read_text(errors="replace") for path in files)


def test_the_coordinator_rewinds_exactly_at_every_step_and_its_ranks_import_no_torch(ray_session):
    ray = ray_session
    config = runtime_config(3, 1, bundle_resources={"CPU": 0.05}, rank_actor_num_cpus=0.05, name="test_synthetic")
    expected = _reference(config, STEPS)
    with running_coordinator(ray, config, SPEC) as coordinator:
        client = CoordinatorClient(coordinator, timeout_s=TIMEOUT_S)

        def take() -> list[str]:
            step, refs = client.next_step()
            ids = [i for batch in ray.get(refs, timeout=TIMEOUT_S) for i in batch["source_ids"]]
            client.commit(step)
            return ids

        reference = assert_rewinds_at_every_step(
            take, client.state_dict, client.load_state_dict, STEPS, before_rewind=lambda: client.next_step()
        )
        status = client.status()
        libraries = {rank["rank"]: _rank_libraries(rank["pid"]) for rank in status["ranks"]}  # while the ranks live
    assert reference == [[i for rank in step for i in rank] for step in expected]
    assert status["restarts"] == [0, 0, 0] and status["rewinds"] == STEPS
    assert libraries == {0: [], 1: [], 2: []}, "a rank maps torch or tokenizers"
    assert not _ray_warned_of_a_blocking_get(ray, status["pid"])


def test_a_killed_rank_is_replaced_and_continues_exactly(ray_session, tmp_path):
    ray = ray_session
    config = runtime_config(4, 2, bundle_resources={"CPU": 0.05}, rank_actor_num_cpus=0.05, name="test_synthetic_kill")
    expected = _reference(config, STEPS)
    with running_coordinator(ray, config, SPEC) as coordinator:
        client = CoordinatorClient(coordinator, timeout_s=TIMEOUT_S)
        found = []
        for step_index in range(STEPS):
            if step_index == 3:  # one step pending, ranks prefetching: kill rank 2
                name = client.status()["rank_actor_names"][2]
                ray.kill(ray.get_actor(name, namespace=config.namespace), no_restart=True)
            _, refs = client.next_step(commit=step_index or None)
            found.append([list(batch["source_ids"]) for batch in ray.get(refs, timeout=TIMEOUT_S)])
        client.commit(STEPS)
        saved = client.save_checkpoint(str(tmp_path / "ckpt"))
        status = client.status()
    assert found == expected
    assert status["restarts"] == [0, 0, 1, 0]
    assert Path(saved).stat().st_size > 0


def test_the_prompt_feed_serves_synthetic_prompts_exactly_once_per_epoch(ray_session):
    from rl_data.prompt_feed.client import RolloutClient
    from rl_data.prompt_feed.feed import (
        FeedConfig,
        check_prompt_spec,
        start_prompt_feed,
    )

    ray = ray_session
    check_prompt_spec(SPEC)
    config = runtime_config(2, 1, bundle_resources={"CPU": 0.05}, rank_actor_num_cpus=0.05, name="test_synthetic_feed")
    feed = start_prompt_feed(config, SPEC, FeedConfig(max_outstanding=64))
    try:
        client = RolloutClient(feed, timeout_s=TIMEOUT_S)
        per_epoch: dict[int, list[str]] = {}
        while len(per_epoch.get(1, [])) < 12:
            prompts = client.take(5)
            client.ack([p.uid for p in prompts])
            for prompt in prompts:
                per_epoch.setdefault(prompt.uid[0], []).append(prompt.key)
                assert len(prompt.payload["token_ids"]) == 5
        wait_for(lambda: client.status()["totals"]["acked"] >= 24, "the acks")
        assert not _ray_warned_of_a_blocking_get(ray, client.status()["pid"])
    finally:
        shut_down(ray, feed, config.name, config.namespace)
    every = sorted(f"synthetic-{i}" for i in range(14))
    for epoch in (0, 1):  # 2 ranks x 3 batches of 2 per pass: 12 of the 14 samples, each once
        assert len(per_epoch[epoch][:12]) == len(set(per_epoch[epoch][:12])) == 12
        assert set(per_epoch[epoch][:12]) <= set(every)
