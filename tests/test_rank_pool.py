"""RankPool: the supervisor of the coordinator's and the feed's rank actors.

Pure parts (names, death counting, checkpoint checks against real loader identities) without Ray;
the pool itself on real local Ray: readiness, calls with errors naming the rank, replacement counted
against ``max_rank_restarts``, a rewind in place, restores, status, shutdown. The pool is the subject,
not what its loaders read, so its ranks run the synthetic task (:data:`SYNTHETIC`: the same rank
actors over loaders that import no torch, tokenizer or Energon, a fifth of an Energon rank's start).
"""

from __future__ import annotations

import asyncio
import copy

import pytest
from distributed_fixtures import TIMEOUT_S, runtime_config, train_spec, wait_for
from energon_fixtures import write_chat_dataset

from rl_data.distributed.config import LoaderSpec, RuntimeConfig
from rl_data.distributed.placement import config_layout, placement_fingerprint
from rl_data.distributed.rank_actor import RankActor
from rl_data.distributed.rank_pool import (
    REWEIGHT_HINT,
    RankFailedError,
    RankPool,
    RankTimeoutError,
    RestoreIncompleteError,
    check_rank_checkpoint,
    count_rank_death,
    rank_actor_name,
    refuse_if_restore_failed,
)
from rl_data.tasks.synthetic import synthetic_loader_spec

#: 3 batches of 2 per pass of 7 samples.
SYNTHETIC = synthetic_loader_spec(batch_size=2, samples_per_rank=7, tokens_per_sample=5, name="synthetic-rank-pool")


def _identities(spec: LoaderSpec, config: RuntimeConfig, tokenizer) -> list[dict]:
    """The loader identity of every rank of ``config``, from real loaders (no Ray)."""
    from rl_data.energon.sft_dataloader import build_energon_sft_loader

    identities = []
    for rank in range(config.world_size):
        loader = build_energon_sft_loader(
            **spec.builder_kwargs(), processor=tokenizer, logical_rank=rank, logical_world_size=config.world_size,
            placement_fingerprint=placement_fingerprint(config_layout(config)),
        )  # fmt: skip
        identities.append(loader.identity)
        loader.close()
    return identities


# -- pure parts ------------------------------------------------------------------------------


def test_names_are_unique_per_instance_rank_and_death():
    assert rank_actor_name("feed", "a1b2c3", 1, 0) == "feed.a1b2c3.rank1.0"
    assert rank_actor_name("feed", "a1b2c3", 1, 3) == "feed.a1b2c3.rank1.3"
    names = {rank_actor_name("c", i, r, d) for i in ("x", "y") for r in range(3) for d in range(3)}
    assert len(names) == 18


def test_a_rank_dies_max_restarts_times_then_fails_naming_the_cause():
    restarts = [0, 0]
    for _ in range(2):
        count_rank_death(restarts, 1, 2, RuntimeError("actor died\ntraceback..."), " (while serving steps)")
    assert restarts == [0, 2]
    with pytest.raises(RankFailedError, match=r"^rank 1 died 3 times, more than max_rank_restarts=2; last cause \(while serving steps\): actor died$"):
        count_rank_death(restarts, 1, 2, RuntimeError("actor died\ntraceback..."), " (while serving steps)")


def test_a_failed_restore_refuses_calls_naming_it():
    refuse_if_restore_failed(None, "take")
    with pytest.raises(RestoreIncompleteError, match=r"^refusing take: restoring a checkpoint failed: boom; some ranks may hold"):
        refuse_if_restore_failed("restoring a checkpoint failed: boom", "take")


def test_checkpoint_checks_refuse_another_layout_count_or_identity(energon_dataset, tokenizer):
    spec, config = train_spec(energon_dataset), runtime_config(2, 1)
    layout, identities = config_layout(config), _identities(spec, config, tokenizer)
    check_rank_checkpoint(layout, layout, identities, identities, owner="coordinator")  # the same: restores

    four = config_layout(runtime_config(4, 1))
    with pytest.raises(ValueError) as changed:
        check_rank_checkpoint(four, layout, identities * 2, identities, owner="coordinator")
    assert str(changed.value) == (
        "Placement layout changed: bundles [{'CPU': 0.25}, {'CPU': 0.25}, {'CPU': 0.25}, {'CPU': 0.25}] -> "
        "[{'CPU': 0.25}, {'CPU': 0.25}]; logical_world_size 4 -> 2; the checkpoint holds 4 logical data shards: "
        "restore with logical_world_size=4, the same bundles and strategy; parallel_layout.dp may be any of [1, 2, 4]"
    )
    with pytest.raises(ValueError, match=r"^feed checkpoint holds 1 rank states for logical world size 2; the checkpoint is damaged$"):
        check_rank_checkpoint(layout, layout, identities[:1], identities, owner="feed")
    other = copy.deepcopy(identities)
    other[1]["batch_size"] = 8
    with pytest.raises(ValueError, match=r"^rank 1: Energon loader identity changed: batch_size 8 -> 2$"):
        check_rank_checkpoint(layout, layout, other, identities, owner="coordinator", reweight=True)


@pytest.fixture(scope="module")
def members(tmp_path_factory, chat_conversations):
    return {
        name: write_chat_dataset(tmp_path_factory.mktemp(f"pool_mixture_{name}"), chat_conversations[40 * i : 40 * i + 40],
                                 samples_per_shard=20, splits={"train": 1.0})
        for i, name in enumerate(("math", "chat"))
    }  # fmt: skip


def _mixture_spec(members, weights):
    mixture = [{"name": n, "path": str(members[n].path), "weight": w} for n, w in weights.items()]
    return LoaderSpec(
        data_config={"energon": {"shuffle_buffer_size": 8, "max_samples_per_sequence": 4}, "shuffle": True},
        source={"mixture": mixture, "split": "train", "epoch_mode": "virtual", "virtual_epoch_length": 10},
        batch_size=4, max_sequence_length=256,
    )  # fmt: skip


def test_changed_mixture_weights_are_refused_with_the_reweight_hint_unless_reweighting(members, tokenizer):
    config = runtime_config(2, 1)
    layout = config_layout(config)
    saved = _identities(_mixture_spec(members, {"math": 0.7, "chat": 0.3}), config, tokenizer)
    current = _identities(_mixture_spec(members, {"math": 0.4, "chat": 0.6}), config, tokenizer)
    with pytest.raises(ValueError) as refused:
        check_rank_checkpoint(layout, layout, saved, current, owner="coordinator")
    assert str(refused.value) == (
        "rank 0: Energon loader identity changed: mixture.chat.weight 0.3 -> 0.6; mixture.math.weight 0.7 -> 0.4"
        + REWEIGHT_HINT
    )
    assert REWEIGHT_HINT.endswith("restore with reweight=True")
    check_rank_checkpoint(layout, layout, saved, current, owner="coordinator", reweight=True)  # asked: accepted
    with pytest.raises(ValueError, match=r"weight 0.7 -> 0.4; the feed keeps its weights$"):  # an owner's own hint
        check_rank_checkpoint(layout, layout, saved, current, owner="feed", reweight_hint="; the feed keeps its weights")
    # another change besides the weights: refused without the hint, reweight or not
    other = copy.deepcopy(saved)
    for identity in other:
        identity["batch_size"] = 8
    for reweight in (False, True):
        with pytest.raises(ValueError) as refused:
            check_rank_checkpoint(layout, layout, other, current, owner="coordinator", reweight=reweight)
        assert "reweight=True" not in str(refused.value) and "batch_size 8 -> 4" in str(refused.value)


# -- the pool on real Ray --------------------------------------------------------------------


def _run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 5 * TIMEOUT_S))


@pytest.mark.timeout(300)
def test_the_pool_supervises_its_ranks(ray_session):
    """Readiness, calls, a death past the limit, a rewind in place, a restore, status and
    shutdown of a 2-rank pool driven from this process (as the coordinator drives it); its
    rank actors, replacements included, share one Ray actor class."""
    from ray.util.placement_group import placement_group_table

    ray = ray_session
    config = runtime_config(2, 0, name="rank_pool_test", max_rank_restarts=1, step_timeout_s=1.0, injected_delay_s={1: 3.0})
    ray_classes = set(RankActor.__subclasses__())  # ray.remote's classes: a process keeps each one it started an actor of
    pool = RankPool(config, SYNTHETIC, owner="coordinator")

    async def scenario():
        states = await pool.ready()
        assert await pool.ready() is states  # once
        assert [s["identity"]["topology"]["logical_rank"] for s in states] == [0, 1]
        first = pool.names
        assert [name.split(".", 2)[2] for name in first] == ["rank0.0", "rank1.0"]
        pool.check_checkpoint(pool.placement.layout, [s["identity"] for s in states])  # its own states restore

        # a rank that is late: the error names it, what it was doing and what it reports
        _, state_ref = pool.actors[1].next_batch.remote()
        with pytest.raises(RankTimeoutError, match=r"^rank 1 did not finish producing a batch within 1 s \(it has been producing batch 0 for [0-9.]+ s; produced 0 batches, 0 ready, pid \d+\); raise step_timeout_s"):
            await pool.wait(state_ref, 1, "producing a batch", config.step_timeout_s)

        # a death is counted and the rank replaced in its bundle under a new name; past the limit it fails
        ray.kill(pool.actors[0], no_restart=True)
        with pytest.raises(ray.exceptions.RayActorError):
            await pool.wait(pool.actors[0].status.remote(), 0, "answering")
        replacement = pool.replace(0, RuntimeError("killed by the test"), "serving steps")
        assert replacement is pool.actors[0] and pool.restarts == [1, 0]
        made = set(RankActor.__subclasses__()) - ray_classes
        assert not made, f"starting and replacing ranks made {len(made)} new Ray actor classes, expected none (one class for every rank actor)"
        assert pool.names[0].endswith(".rank0.1") and pool.names[1] == first[1]
        await pool.restore_rank(0, states[0])  # a fresh actor loads a state
        assert (await pool.wait(replacement.status.remote(), 0, "answering"))["rank"] == 0
        with pytest.raises(RankFailedError, match=r"^rank 0 died 2 times, more than max_rank_restarts=1; last cause \(while serving steps\): killed again"):
            pool.replace(0, RuntimeError("killed again"), "serving steps")
        assert pool.actors[0] is replacement and pool.names[0].endswith(".rank0.1")  # the actor it still has

        # a rewind: a live rank (rank 1 started producing above) restores in place, no death counted
        before, pid = pool.names, (await pool.wait(pool.actors[1].status.remote(), 1, "answering"))["pid"]
        await asyncio.gather(*(pool.restore_rank(r, s) for r, s in enumerate(states)))
        assert pool.names == before and pool.restarts == [2, 0]  # the refused replacement above counted
        assert (await pool.wait(pool.actors[1].status.remote(), 1, "answering"))["pid"] == pid

        # one restore at a time; one that fails refuses calls until one succeeds
        with pool.restore_slot("load_state_dict"):
            with pytest.raises(RuntimeError, match=r"^load_checkpoint refused: another restore of this coordinator is in flight; expected one restore at a time"):
                with pool.restore_slot("load_checkpoint"):
                    pass
        with pytest.raises(ValueError):
            with pool.restoring("the checkpoint of step 3"):
                raise ValueError("damaged")
        with pytest.raises(RestoreIncompleteError, match=r"^refusing next_step: restoring the checkpoint of step 3 failed: damaged"):
            pool.refuse_if_restore_failed("next_step")
        with pool.restoring("the checkpoint of step 3"):
            pass
        pool.refuse_if_restore_failed("next_step")

        return await pool.status()

    try:
        status = _run(scenario())
        assert set(status) == {"placement_fingerprint", "restarts", "restore_failure", "rank_actor_names", "ranks", "objects_in_memory"}
        assert isinstance(status["objects_in_memory"], int) and status["objects_in_memory"] >= 0
        assert status["placement_fingerprint"] == placement_fingerprint(config_layout(config))
        assert (status["restarts"], status["restore_failure"], status["rank_actor_names"]) == ([2, 0], None, pool.names)
        assert [r["rank"] for r in status["ranks"]] == [0, 1]
        group = [g for g in placement_group_table().values() if g["name"] == "rl_data.coordinator:rl_data_tests/rank_pool_test"]
        assert [g["state"] for g in group] == ["CREATED"]
    finally:
        names = pool.names
        pool.shutdown()
    for name in names:  # every rank actor is gone, and the group the pool made
        try:
            actor = ray.get_actor(name, namespace=config.namespace)
        except ValueError:
            continue
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.status.remote(), timeout=TIMEOUT_S)
    wait_for(
        lambda: [g["state"] for g in placement_group_table().values() if g["name"] == "rl_data.coordinator:rl_data_tests/rank_pool_test"] == ["REMOVED"],
        "the pool's placement group to be removed",
    )


def test_a_pool_that_cannot_reserve_its_bundles_names_them(ray_session, energon_dataset):
    config = runtime_config(2, 0, name="rank_pool_unplaceable", bundle_resources={"CPU": 100.0}, control_timeout_s=1.0)
    pool = RankPool(config, train_spec(energon_dataset), owner="feed")
    try:
        with pytest.raises(RankTimeoutError, match=r"^the feed did not finish reserving the placement group \(bundles \[\{'CPU': 100\.0\}, \{'CPU': 100\.0\}\], PACK\) within 1 s; check that the cluster has these resources free$"):
            _run(pool.ready())
    finally:
        pool.shutdown()
