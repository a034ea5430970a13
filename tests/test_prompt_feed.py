"""The prompt feed runtime on real local Ray, a real ``rl_prompt`` Energon dataset and the real tokenizer.

Every test compares what the feed handed out with a reference read directly from the same
loaders in the test process (no Ray): epoch e is pass e of every rank, merged item by item
round-robin (:mod:`rl_data.prompt_feed.merge`), so uid ``(e, p)`` must carry reference key
``reference[e][p]``.

Starting a rank actor (torch, the tokenizer, Energon) is most of this module's cost, so the tests
whose subject is the feed runtime itself (holders, refused checkpoints and restores, killed rank
actors, a detached feed) run on the synthetic task (:data:`SYNTHETIC_SPEC`: the same feed, ledger
and rank actors over loaders that import no torch, tokenizer or Energon; their reference is read
from the same synthetic loaders), and the tests that need no feed of their own share one per
loader spec (:func:`shared_feed`), rewound at each test's start to its state before its first take.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed_fixtures import ENERGON_WORKERS_0_SLOW, TIMEOUT_S, runtime_config, shut_down, wait_for
from restore_check import assert_rewinds_at_every_step

from rl_data.config_blocks import ConfigError
from rl_data.distributed.client import wait_until_name_is_free
from rl_data.distributed.config import LoaderSpec, RuntimeConfig
from rl_data.distributed.placement import config_layout, placement_fingerprint
from rl_data.distributed.rank_actor import loader_builder
from rl_data.energon.dataset_writer import write_energon_dataset
from rl_data.energon.sample_format import encode_sample
from rl_data.preprocess.adapters import resolve_adapter
from rl_data.prompt_data import arithmetic_word_problems
from rl_data.prompt_feed.ledger import UidStateError
from rl_data.prompt_feed.merge import Uid
from rl_data.prompt_feed.client import attach_feed
from rl_data.prompt_feed.feed import FeedConfig, check_prompt_spec, start_prompt_feed
from rl_data.tasks.synthetic import STUB_TOKENIZER_PATH, load_stub_tokenizer, synthetic_loader_spec

#: 40 prompts in 10 shards, all train; 2 ranks x 20 prompts, batches of 4: no partial batch,
#: so every epoch holds all 40 prompts (in a new order).
PROMPTS, WORLD, BATCH = 40, 2, 4
NAMESPACE = "rl_data_feed_tests"
#: The synthetic task in the same shape (2 ranks x 20 samples, batches of 4: 40 prompts an epoch),
#: for the tests of the feed runtime: its rank actors start in a fifth of an Energon rank's time.
SYNTHETIC_SPEC = synthetic_loader_spec(batch_size=BATCH, samples_per_rank=PROMPTS // WORLD, tokens_per_sample=16,
                                       name="feed-synthetic")  # fmt: skip
#: The window of the shared feeds (:func:`shared_feed`): room for what any of their tests holds.
SHARED_WINDOW = FeedConfig(max_outstanding=60)


@pytest.fixture(scope="module")
def prompt_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("feed_prompts")
    adapt = resolve_adapter("gsm8k")
    samples = [
        (f"prompt-{row:03d}", encode_sample({**adapt(raw), "source": {"file": "gsm8k", "row": row}}))
        for row, raw in enumerate(arithmetic_word_problems(PROMPTS))
    ]
    write_energon_dataset(root, samples, samples_per_shard=4, splits={"train": 1.0})
    return str(root)


def _spec(root: str, workers: int = 0, **source: Any) -> LoaderSpec:
    energon = {"task": "rl_prompt", "num_workers": workers, "shuffle_buffer_size": 6, "max_samples_per_sequence": 2}
    return LoaderSpec(
        data_config={"energon": energon, "shuffle": True, "task": {"generation_padding": "left"}},
        source={"path": root, "split": "train", **source},
        batch_size=BATCH,
        max_sequence_length=256,
    )


def _config(world: int = WORLD, **overrides: Any) -> RuntimeConfig:
    return runtime_config(world, 2, namespace=NAMESPACE, name=f"feed-{uuid.uuid4().hex[:8]}", **overrides)


@pytest.fixture(scope="module")
def reference_of(tokenizer) -> Callable[[LoaderSpec], list[list[str]]]:
    """``reference_of(spec)``: :func:`_reference` of ``spec``, read once per module."""
    references: dict[str, list[list[str]]] = {}

    def of(spec: LoaderSpec) -> list[list[str]]:
        key = spec.model_dump_json()
        if key not in references:
            references[key] = _reference(spec, tokenizer)
        return references[key]

    return of


@pytest.fixture(scope="module")
def reference(prompt_root, reference_of) -> list[list[str]]:
    """``[epoch][position] -> key`` for 3 epochs of the 2-rank feed, read from the loaders directly."""
    return reference_of(_spec(prompt_root))


@pytest.fixture(scope="module")
def synthetic_reference(reference_of) -> list[list[str]]:
    """The same for a feed over :data:`SYNTHETIC_SPEC`."""
    return reference_of(SYNTHETIC_SPEC)


def _reference(spec: LoaderSpec, tokenizer: Any) -> list[list[str]]:
    """``[epoch][position] -> key`` for 3 epochs of a 2-rank feed over ``spec``, read from the loaders
    directly (built as a rank actor builds them: Energon's with ``tokenizer``, the synthetic task's with its stub)."""
    config = _config()
    processor = load_stub_tokenizer() if spec.processor_factory == STUB_TOKENIZER_PATH else tokenizer
    passes = []
    for rank in range(WORLD):
        loader = loader_builder(spec)(
            spec, processor, logical_rank=rank, logical_world_size=WORLD,
            placement_fingerprint=placement_fingerprint(config_layout(config)),
        )  # fmt: skip
        passes.append([[key for batch in loader for key in batch["source_ids"]] for _ in range(3)])
        loader.close()
    epochs = []
    for epoch in range(3):
        rows = itertools.zip_longest(*(passes[rank][epoch] for rank in range(WORLD)))
        epochs.append([key for row in rows for key in row if key is not None])
    return epochs


@contextlib.contextmanager
def running_feed(ray: Any, config: RuntimeConfig, spec: LoaderSpec, feed: FeedConfig) -> Iterator[Any]:
    handle = start_prompt_feed(config, spec, feed)
    try:
        yield handle
    finally:
        shut_down(ray, handle, config.name, config.namespace)


@dataclasses.dataclass(frozen=True)
class SharedFeed:
    """A running feed several tests use (:func:`shared_feed`) and its state before its first take."""

    config: RuntimeConfig
    handle: Any
    fresh_state: dict[str, Any]


@pytest.fixture(scope="module")
def shared_feed(ray_session) -> Iterator[Callable[[LoaderSpec], SharedFeed]]:
    """``shared_feed(spec)``: the module's running feed over ``spec`` (window :data:`SHARED_WINDOW`,
    started on first use, shut down after the module's last test), in its state before its first
    take: nothing taken, resolved, held or released, as a fresh feed. Once used, it is rewound to
    that state: the rank actors restore in place (far cheaper than starting a feed and its rank
    actors); what a rewind keeps (the call totals, the rank actors, the metrics) is compared with its
    value at the test's start. No test kills a shared feed's rank actors: their restarts stay 0. A
    feed that does not come back (a failed test left it refusing takes: a failed restore) is replaced."""
    feeds: dict[str, SharedFeed] = {}

    def rewind(feed: SharedFeed) -> None:
        """Restore ``feed`` to its state before its first take (each rank builds a new loader for it
        when its loader was read or restored since: a loader restores once)."""
        ray_session.get(feed.handle.load_state_dict.remote(feed.fresh_state), timeout=TIMEOUT_S)

    def rewound(spec: LoaderSpec) -> SharedFeed:
        key = spec.model_dump_json()
        if key in feeds:
            try:
                rewind(feeds[key])
            except Exception:  # noqa: BLE001 - whatever a failed test left: a new feed
                feed = feeds.pop(key)
                shut_down(ray_session, feed.handle, feed.config.name, feed.config.namespace)
        if key not in feeds:
            config = _config()
            handle = start_prompt_feed(config, spec, SHARED_WINDOW)
            feeds[key] = SharedFeed(config, handle, ray_session.get(handle.state_dict.remote(), timeout=TIMEOUT_S))
        return feeds[key]

    try:
        yield rewound
    finally:
        for feed in feeds.values():
            shut_down(ray_session, feed.handle, feed.config.name, feed.config.namespace)


def _same(a: Any, b: Any) -> bool:
    """Equal payloads: same structure, equal values, tensors equal in dtype, shape and values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def _scrape(port: int, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = [
        s.value for family in text_string_to_metric_families(text) for s in family.samples
        if s.name == name and set(labels.items()) <= set(s.labels.items())
    ]  # fmt: skip
    return sum(values) if values else None


def _wait_for_metrics(port: int, expected: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict:
    deadline = time.monotonic() + 60  # one or two of Ray's 10 s metrics report intervals
    while True:
        observed = {key: _scrape(port, key[0], **dict(key[1])) for key in expected}
        if observed == expected or time.monotonic() > deadline:
            return observed
        time.sleep(0.5)


def _kill_feed(ray: Any, handle: Any, config: RuntimeConfig) -> None:
    """Kill the feed actor and its rank actors without shutdown (as a crash would)."""
    names = ray.get(handle.status.remote(), timeout=TIMEOUT_S)["rank_actor_names"]
    ray.kill(handle, no_restart=True)
    for name in names:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(name, namespace=config.namespace), no_restart=True)
    wait_until_name_is_free(config.name, config.namespace, TIMEOUT_S)


def test_the_feed_refuses_loaders_that_are_not_rl_prompts_in_exact_passes(tmp_path):
    check_prompt_spec(_spec(str(tmp_path)))
    check_prompt_spec(_spec(str(tmp_path), epoch_mode="virtual", virtual_epoch_length=5))  # one endless epoch
    with pytest.raises(ConfigError, match=r"epoch_mode 'exact' and virtual_epoch_length 5, expected 0"):
        check_prompt_spec(_spec(str(tmp_path), virtual_epoch_length=5))
    validation = _spec(str(tmp_path)).model_copy(update={"split_role": "validation"})
    with pytest.raises(ConfigError, match=r"^a prompt feed needs RL prompts in exact passes or one endless epoch: split_role is 'validation'"):
        check_prompt_spec(validation)
    sft = LoaderSpec(data_config={"energon": {"task": "chat_sft"}, "shuffle": True}, source={"path": str(tmp_path), "split": "train"},
                     batch_size=BATCH, max_sequence_length=256)
    with pytest.raises(ConfigError, match=r"data_config\['energon'\]\['task'\] is 'chat_sft', a task whose batches are not prompts .* "
                                          r"expected 'rl_prompt'; set it to 'rl_prompt'"):
        check_prompt_spec(sft)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_concurrent_callers_resolve_every_prompt_of_two_epochs_exactly_once(
    ray_session, metrics_port, prompt_root, reference
):
    assert sorted(reference[0]) == sorted(reference[1]) == sorted(f"prompt-{i:03d}" for i in range(PROMPTS))
    assert reference[0] != reference[1]  # a new order each epoch
    config = _config()
    with running_feed(ray_session, config, _spec(prompt_root), FeedConfig(max_outstanding=6, take_wait_s=0.5)):
        rollout, trainer = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S)
        lock, done, errors = threading.Lock(), threading.Event(), []
        first: dict[Uid, tuple[str, Any]] = {}  # uid -> key and payload when first handed out
        resolved: dict[Uid, str] = {}
        counts = Counter()  # (epoch, "ack" | "drop" | "release" | "rehanded") -> prompts

        def record_take(prompts: list[Any]) -> None:
            with lock:
                for prompt in prompts:
                    if prompt.uid in first:
                        assert (prompt.key, True) == (first[prompt.uid][0], _same(prompt.payload, first[prompt.uid][1]))
                        counts[prompt.uid.epoch, "rehanded"] += 1
                    first.setdefault(prompt.uid, (prompt.key, prompt.payload))

        def record(uids: list[Uid], action: str) -> None:
            with lock:
                for uid in uids:
                    counts[uid.epoch, action] += 1
                    if action != "release":
                        assert uid not in resolved
                        resolved[uid] = action
                if sum(uid.epoch < 2 for uid in resolved) == 2 * PROMPTS:
                    done.set()

        # the window: take returns what fits, waits up to wait_s for room, released prompts come first
        held = rollout.take(10)
        assert [p.uid for p in held] == [(0, i) for i in range(6)]
        started = time.monotonic()
        assert rollout.take(1, wait_s=0.3) == [] and time.monotonic() - started >= 0.3
        threading.Timer(0.5, rollout.release, args=([held[4].uid, held[1].uid],)).start()
        again = rollout.take(2, wait_s=30)
        assert [p.uid for p in again] == [(0, 1), (0, 4)]
        record_take(held)
        record(sorted({held[4].uid, held[1].uid}), "release")
        record_take(again)
        rollout.release([p.uid for p in held])
        record([p.uid for p in held], "release")

        def worker(index: int) -> None:
            rng = random.Random(index)
            try:
                while not done.is_set():
                    prompts = rollout.take(rng.randint(1, 4), wait_s=0.5)
                    record_take(prompts)
                    time.sleep(rng.random() * 0.02)  # rollouts of different lengths
                    rng.shuffle(prompts)  # groups finish out of order
                    for prompt in prompts:
                        action = rng.choices(["ack", "drop", "release"], [6, 2, 2])[0]
                        if action == "ack":
                            trainer.ack([prompt.uid])
                        elif action == "drop":
                            trainer.drop([prompt.uid], "uniform_reward")
                        else:
                            rollout.release([prompt.uid])
                        record([prompt.uid], action)
            except BaseException as error:  # reported by the main thread
                errors.append(error)
                done.set()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=180)
        assert not errors, errors
        assert not any(thread.is_alive() for thread in threads)

        for epoch in (0, 1):
            got = {uid.position: first[uid][0] for uid in resolved if uid.epoch == epoch}
            assert got == dict(enumerate(reference[epoch]))  # every prompt once, at its reference uid
        assert counts[0, "release"] + counts[1, "release"] > 8  # released by the workers too
        assert counts[0, "rehanded"] + counts[1, "rehanded"] > 8
        # one more prompt: the stream has certainly reached the end of epoch 1 (its size is known)
        last = rollout.take(1)
        record_take(last)
        trainer.ack([last[0].uid])
        record([last[0].uid], "ack")
        assert last[0].uid.epoch == 2

        with pytest.raises(Exception, match=r"cannot ack uid \(0, 3\) .*: it is already resolved"):
            trainer.ack([(0, 3)])
        status = rollout.status()
        for epoch in (0, 1):
            summary = status["epochs"][epoch]
            assert summary["epoch"] == epoch and summary["size"] == PROMPTS and summary["resolved_exactly_once"]
            assert (summary["acked"], summary["dropped"].get("uniform_reward", 0), summary["released"]) == (
                counts[epoch, "ack"], counts[epoch, "drop"], counts[epoch, "release"])
            assert summary["rehanded"] == counts[epoch, "rehanded"]
        total = {action: sum(v for (e, a), v in counts.items() if a == action) for action in ("ack", "drop", "release")}
        assert status["totals"] == {
            "taken": len(first) + sum(v for (e, a), v in counts.items() if a == "rehanded"),
            "acked": total["ack"], "dropped": total["drop"], "released": total["release"],
        }  # fmt: skip
        assert status["outstanding"] == 0 and status["oldest_outstanding_age_s"] == 0.0
        assert status["epoch"] == 2 and status["max_outstanding"] == 6 and status["restarts"] == [0, 0]

        tags = {"feed": config.name}
        key = lambda name, **more: (name, tuple(sorted({**tags, **more}.items())))  # noqa: E731
        expected = {
            key("ray_rl_data_feed_acks_total"): float(total["ack"]),
            key("ray_rl_data_feed_drops_total", reason="uniform_reward"): float(total["drop"]),
            key("ray_rl_data_feed_releases_total"): float(total["release"]),
            key("ray_rl_data_feed_taken_total"): float(status["totals"]["taken"]),
            key("ray_rl_data_feed_outstanding"): 0.0,
            key("ray_rl_data_feed_oldest_outstanding_age_seconds"): 0.0,
            key("ray_rl_data_feed_epoch"): 2.0,
            key("ray_rl_data_feed_low_water_mark_epoch"): float(status["low_water_mark"][0]),
            key("ray_rl_data_feed_low_water_mark_position"): float(status["low_water_mark"][1]),
        }
        assert _wait_for_metrics(metrics_port, expected) == expected


@pytest.mark.timeout(300)
def test_a_restored_feed_hands_out_every_unresolved_prompt_again_in_uid_order(ray_session, prompt_root, reference, tmp_path):
    config, spec, window = _config(), _spec(prompt_root), FeedConfig(max_outstanding=50)
    first = start_prompt_feed(config, spec, window)
    rollout, trainer = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S)
    taken = rollout.take(43)  # all of epoch 0, 3 of epoch 1
    assert [p.key for p in taken] == reference[0] + reference[1][:3]
    assert [p.uid for p in taken] == [(0, i) for i in range(40)] + [(1, 0), (1, 1), (1, 2)]
    by_uid = {p.uid: p for p in taken}
    in_flight, released, dropped = [(0, 5), (0, 17), (0, 33), (1, 0), (1, 2)], [(0, 20)], [(0, 11)]
    rollout.release(released)
    trainer.drop(dropped, "too_easy")
    trainer.ack([uid for uid in by_uid if uid not in in_flight + released + dropped])
    trainer.save_checkpoint(str(tmp_path))
    # progress after the checkpoint is lost with the feed, as with the model
    assert [p.uid for p in rollout.take(3)] == [(0, 20), (1, 3), (1, 4)]
    trainer.ack(in_flight + [(0, 20), (1, 3), (1, 4)])
    _kill_feed(ray_session, first, config)

    with running_feed(ray_session, config, spec, window) as second:
        rollout, trainer = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S)
        summary = ray_session.get(second.load_checkpoint.remote(str(tmp_path)), timeout=TIMEOUT_S)
        assert (summary["epochs"][0]["acked"], summary["epochs"][0]["dropped"]) == (35, {"too_easy": 1})
        again = rollout.take(10)
        assert [p.uid for p in again] == [(0, 5), (0, 17), (0, 20), (0, 33), (1, 0), (1, 2), (1, 3), (1, 4), (1, 5), (1, 6)]
        for prompt in again[:6]:  # identical content
            assert prompt.key == by_uid[prompt.uid].key and _same(prompt.payload, by_uid[prompt.uid].payload)
        assert [p.key for p in again[6:]] == reference[1][3:7]
        with pytest.raises(Exception, match=r"cannot ack uid \(0, 11\) .*: it is already resolved"):
            trainer.ack([(0, 11)])
        trainer.ack([p.uid for p in again])
        rest = rollout.take(40)
        assert [p.key for p in rest if p.uid.epoch == 1] == reference[1][7:]
        assert [p.key for p in rest if p.uid.epoch == 2] == reference[2][:7]
        trainer.ack([p.uid for p in rest])
        epochs = rollout.status()["epochs"]
        assert [e["resolved_exactly_once"] for e in epochs] == [True, True, None]
        assert (epochs[0]["acked"], epochs[0]["dropped"], epochs[1]["acked"]) == (39, {"too_easy": 1}, 40)


@pytest.mark.timeout(300)
def test_killed_rank_actors_are_replaced_without_losing_or_repeating_a_prompt(
    ray_session, metrics_port, synthetic_reference
):
    """On the synthetic task (the subject is the feed's rank replacement, not the loader), in a feed
    of its own: its rank deaths count against the feed's restart budget and its metrics."""
    reference, config = synthetic_reference, _config()
    with running_feed(ray_session, config, SYNTHETIC_SPEC, FeedConfig(max_outstanding=100)):
        rollout, trainer = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S)
        keys = []
        for count, victim in ((7, 0), (13, 1), (30, None)):  # rank 0 between batches, rank 1 mid-batch
            prompts = rollout.take(count)
            trainer.ack([p.uid for p in prompts])
            keys += [p.key for p in prompts]
            if victim is not None:
                name = rollout.status()["rank_actor_names"][victim]
                ray_session.kill(ray_session.get_actor(name, namespace=config.namespace), no_restart=True)
                wait_until_name_is_free(name, config.namespace, TIMEOUT_S)
        assert keys == reference[0] + reference[1][:10]
        status = rollout.status()
        assert status["restarts"] == [1, 1]
        assert [name.rsplit(".", 1)[1] for name in status["rank_actor_names"]] == ["1", "1"]
        assert status["epochs"][0]["resolved_exactly_once"] is True
        key = ("ray_rl_data_feed_restores_total", (("feed", config.name), ("kind", "rank_recovery")))
        assert _wait_for_metrics(metrics_port, {key: 2.0}) == {key: 2.0}


@pytest.mark.timeout(300)
def test_release_holder_gives_back_what_a_dead_worker_held_except_the_results_already_delivered(
    ray_session, shared_feed, synthetic_reference
):
    """Kept prompts stay outstanding, held by nobody: a restarted worker of the same name that dies
    in turn releases only what it took itself. On the shared synthetic feed: holders are the feed's
    bookkeeping, whatever its loaders read."""
    config = shared_feed(SYNTHETIC_SPEC).config
    worker_a, trainer = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S, holder="worker-a")
    worker_b, _ = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S, holder="worker-b")
    a, b = worker_a.take(5), worker_b.take(3)
    anonymous = ray_session.get(trainer.handle.take.remote(2), timeout=TIMEOUT_S)  # nobody's
    assert [p.key for p in a + b + anonymous] == synthetic_reference[0][:10]
    assert worker_a.status()["outstanding_by_holder"] == {"worker-a": 5, "worker-b": 3}
    trainer.ack([a[0].uid])  # resolved: not held any more
    with pytest.raises(UidStateError) as twice:  # the ledger's error crosses Ray whole
        trainer.ack([a[0].uid])
    # (0, 0) is below the low-water mark now: the ledger keeps no per-uid state there
    assert (twice.value.uid, twice.value.state) == (a[0].uid, "already resolved (acked or dropped)")
    worker_a.release([a[1].uid])  # given back by the worker itself
    delivered = [a[2].uid]  # its result reached the trainer, which will ack it
    released = trainer.release_holder("worker-a", keep=delivered)
    assert released == [a[3].uid, a[4].uid]
    assert trainer.release_holder("worker-a", keep=delivered) == []  # nothing twice
    status = worker_a.status()
    assert (status["outstanding"], status["outstanding_by_holder"]) == (1 + 3 + 2, {"worker-b": 3})  # kept: nobody's
    restarted, _ = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S, holder="worker-a")
    retaken = restarted.take(2)  # released prompts first, in uid order
    assert [p.uid for p in retaken] == [a[1].uid, a[3].uid]
    assert trainer.release_holder("worker-a") == [p.uid for p in retaken]  # not the kept one
    again = worker_b.take(3)
    assert [p.uid for p in again] == sorted([a[1].uid, a[3].uid, a[4].uid])
    assert [p.key for p in retaken + again] == [synthetic_reference[0][p.uid.position] for p in retaken + again]
    trainer.ack(delivered + [p.uid for p in b + again + anonymous])
    status = worker_a.status()
    assert status["outstanding"] == 0 and status["outstanding_by_holder"] == {}
    with pytest.raises(Exception, match="take holder must be a non-empty string"):
        ray_session.get(trainer.handle.take.remote(1, None, ""), timeout=TIMEOUT_S)


# -- rewinding a live feed -------------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", ENERGON_WORKERS_0_SLOW)
def test_a_feed_rewound_to_the_checkpoint_after_every_window_hands_out_the_rest_exactly(
    prompt_root, reference_of, shared_feed, workers
):
    """The step oracle on the feed: a step takes 5 prompts and acks them; the live feed (a window
    outstanding, ranks prefetching) is rewound to the checkpoint after every step, across the epoch end."""
    spec = _spec(prompt_root, workers)
    reference = reference_of(spec)
    keys = [key for epoch in reference for key in epoch]
    config = shared_feed(spec).config
    steps = (len(reference[0]) + 4) // 5 + 1  # past the end of epoch 0
    rollout, trainer = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S)

    def take() -> list[str]:
        prompts = rollout.take(5)
        trainer.ack([p.uid for p in prompts])
        return [p.key for p in prompts]

    found = assert_rewinds_at_every_step(take, trainer.state_dict, trainer.load_state_dict, steps,
                                         before_rewind=lambda: rollout.take(5))  # fmt: skip
    assert [key for step in found for key in step] == keys[: 5 * steps]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", ENERGON_WORKERS_0_SLOW)
def test_a_live_feed_rewinds_to_a_checkpoint_and_goes_on_as_a_fresh_restore_would(
    prompt_root, reference_of, shared_feed, tmp_path, workers
):
    """Two rewinds (from a file, then from a state in memory, past an epoch end) of a feed with
    prompts outstanding, released and prefetched; the trainer's record of resolved prompts rolls
    back with each rewind, as it would with the model. Every prompt of two epochs ends up
    resolved exactly once in the surviving record, with its reference key. (A shared feed: no
    test kills its rank actors, so their restarts stay 0.)"""
    spec = _spec(prompt_root, workers)
    reference = reference_of(spec)
    keys = {Uid(e, p): key for e, epoch in enumerate(reference) for p, key in enumerate(epoch)}
    stream, size = sorted(keys), len(reference[0])
    config = shared_feed(spec).config
    rollout, trainer = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S, holder="worker-a")
    kept: list[Uid] = []  # resolved in the surviving history

    def take(n: int) -> list[Uid]:
        prompts = rollout.take(n)
        assert [p.key for p in prompts] == [keys[p.uid] for p in prompts]
        return [p.uid for p in prompts]

    def ack(uids: list[Uid]) -> None:
        trainer.ack(uids)
        kept.extend(uids)

    def unresolved(n: int) -> list[Uid]:
        """The first ``n`` prompts a fresh feed restored from the rewind's checkpoint hands out."""
        done = set(kept)
        return [uid for uid in stream if uid not in done][:n]

    first = take(7)
    ack(first[:4])
    trainer.drop(first[4:5], "too_easy")
    kept += first[4:5]
    rollout.release(first[5:6])  # first[6] stays outstanding
    trainer.save_checkpoint(str(tmp_path / "c1"))
    at_c1 = len(kept)
    later = take(10)
    assert later == [first[5], *stream[7:16]]  # the released one first
    ack(later + first[6:7])
    out = take(5)  # outstanding at the rewind; the rank actors have prefetched more
    rollout.release(out[:1])  # and one released, waiting
    names, pids = rollout.status()["rank_actor_names"], [r["pid"] for r in rollout.status()["ranks"]]

    summary = trainer.load_checkpoint(str(tmp_path / "c1"))  # rewind 1, from a file
    del kept[at_c1:]
    status = rollout.status()
    assert (status["outstanding"], status["outstanding_by_holder"], status["restarts"]) == (0, {}, [0, 0])
    assert (summary["epochs"][0]["acked"], summary["epochs"][0]["dropped"]) == (4, {"too_easy": 1})
    assert status["released_waiting"] == 0 and status["restore_failure"] is None
    assert status["rank_actor_names"] == names and [r["pid"] for r in status["ranks"]] == pids  # rewound in place
    with pytest.raises(UidStateError) as stale:  # handed out before the rewind, not since
        trainer.ack([out[1]])
    assert (stale.value.uid, stale.value.state) == (out[1], "not handed out yet")
    with pytest.raises(UidStateError):
        trainer.ack([first[6]])  # acked after the checkpoint: rolled back, not handed out since

    expected = unresolved(size + 3)  # through the epoch end, into epoch 1
    second = take(size + 3)
    assert second == expected and second[:2] == [first[5], first[6]] and second[-1].epoch == 1
    ack(second[4:-3])
    rollout.release(second[-1:])
    c2 = trainer.state_dict()  # unresolved: second[:4] (epoch 0) and second[-3:] (epoch 1)
    at_c2 = len(kept)
    ack(second[:4] + second[-3:-1] + take(9))
    names = rollout.status()["rank_actor_names"]

    trainer.load_state_dict(c2)  # rewind 2, from a state in memory
    del kept[at_c2:]
    assert rollout.status()["rank_actor_names"] == names  # rewound in place, not replaced
    rest = len(set(stream[: 2 * size]) - set(kept)) + 4  # the rest of epoch 1 and 4 prompts of epoch 2
    expected = unresolved(rest)
    third = take(rest)
    assert third == expected and third[:7] == second[:4] + second[-3:]
    ack(third)

    assert len(kept) == len(set(kept))  # nothing resolved twice
    assert sorted(u for u in kept if u.epoch < 2) == stream[: 2 * size]  # nothing missing
    epochs = rollout.status()["epochs"]
    assert [(e["size"], e["resolved_exactly_once"]) for e in epochs[:2]] == [(size, True), (size, True)]
    assert (epochs[0]["acked"], epochs[0]["dropped"], epochs[1]["acked"]) == (size - 1, {"too_easy": 1}, size)


@pytest.mark.timeout(300)
def test_a_refused_checkpoint_leaves_the_live_feed_serving_as_before(shared_feed, synthetic_reference):
    """On the shared synthetic feed: the checks of a checkpoint (placement, loader identity, merge
    cursor, producer states) are the feed's and its rank pool's, whatever the loaders read."""
    config = shared_feed(SYNTHETIC_SPEC).config
    rollout, trainer = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S, holder="worker-a")
    taken = rollout.take(6)
    assert [p.key for p in taken] == synthetic_reference[0][:6]
    trainer.ack([p.uid for p in taken[:3]])
    good = trainer.state_dict()
    before = rollout.status()
    bad = {name: copy.deepcopy(good) for name in ("layout", "identity", "cursor", "offset")}
    bad["layout"]["placement"]["layout"]["logical_world_size"] = 4
    bad["identity"]["ledger"]["producers"][1]["loader"]["identity"]["batch_size"] = 8
    bad["cursor"]["ledger"]["cursor"]["producer"] = 5
    bad["offset"]["ledger"]["producers"][0]["offset"] = -1
    for name, message in (
        ("layout", r"Placement layout changed: logical_world_size 4 -> 2"),
        ("identity", r"rank 1: Energon loader identity changed: batch_size 8 -> 4"),
        ("cursor", r"merge cursor .* is invalid for 2 producer"),
        ("offset", r"rank 0 producer state has offset -1 and pass 0, expected ints >= 0"),
    ):
        with pytest.raises(ValueError, match=message):
            trainer.load_state_dict(bad[name])
    after = rollout.status()
    assert after["rank_actor_names"] == before["rank_actor_names"] and after["restore_failure"] is None
    assert (after["outstanding"], after["outstanding_by_holder"], after["totals"]) == (
        3, {"worker-a": 3}, before["totals"])
    trainer.ack([p.uid for p in taken[3:]])  # the outstanding prompts are still the holder's
    assert [p.key for p in rollout.take(4)] == synthetic_reference[0][6:10]


@pytest.mark.timeout(300)
def test_a_second_restore_while_one_is_in_flight_is_refused_not_queued(
    ray_session, shared_feed, synthetic_reference, tmp_path
):
    """On the shared synthetic feed. Ray starts an async actor's calls in any order (its default
    ``allow_out_of_order_execution``) and a rewind lasts milliseconds, so the first restore is held in
    flight (rank 0's process stopped: the restore waits for it) and seen in flight in the feed's
    status before the second and the third are sent."""
    feed = shared_feed(SYNTHETIC_SPEC)
    config, handle = feed.config, feed.handle
    rollout, trainer = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S)
    trainer.ack([p.uid for p in rollout.take(2)])
    trainer.save_checkpoint(str(tmp_path))
    state = trainer.state_dict()
    rollout.take(5)

    def first_restore_in_flight() -> bool:
        status = rollout.status()  # ~10 s: the stopped rank does not answer (no CPU meanwhile)
        return status["restore_failure"] == "restoring a checkpoint did not finish"  # until the restore ends

    rank_0 = next(rank["pid"] for rank in rollout.status()["ranks"] if rank["rank"] == 0)
    os.kill(rank_0, signal.SIGSTOP)
    try:
        first = handle.load_state_dict.remote(state)  # a rewind: waits for rank 0
        wait_for(first_restore_in_flight, "the first restore in flight")
        second = handle.load_state_dict.remote(state)
        third = handle.load_checkpoint.remote(str(tmp_path))
        for refused in (second, third):
            with pytest.raises(RuntimeError, match=r"refused: another restore of this feed is in flight"):
                ray_session.get(refused, timeout=TIMEOUT_S)
    finally:
        os.kill(rank_0, signal.SIGCONT)
    ray_session.get(first, timeout=TIMEOUT_S)
    names = rollout.status()["rank_actor_names"]
    trainer.load_checkpoint(str(tmp_path))  # nothing taken since: as cheap as a fresh feed's restore
    assert rollout.status()["rank_actor_names"] == names
    assert [p.key for p in rollout.take(4)] == synthetic_reference[0][2:6]


_DETACHED_STARTER = textwrap.dedent(
    """
    import json, sys
    import ray
    from rl_data.distributed.config import LoaderSpec, RuntimeConfig
    from rl_data.prompt_feed.client import attach_feed
    from rl_data.prompt_feed.feed import FeedConfig, start_prompt_feed

    address, config, spec = sys.argv[1], RuntimeConfig.model_validate_json(sys.argv[2]), LoaderSpec.model_validate_json(sys.argv[3])
    ray.init(address=address, namespace=config.namespace, log_to_driver=False)
    feed = start_prompt_feed(config, spec, FeedConfig(max_outstanding=10))  # held until this process exits
    rollout, trainer = attach_feed(config.name, config.namespace, timeout_s=60)
    taken = rollout.take(3)
    trainer.ack([p.uid for p in taken[:2]])
    print("RESULT " + json.dumps({"keys": [p.key for p in taken], "pid": rollout.status()["pid"]}))
    """
)


@pytest.mark.timeout(300)
def test_a_detached_feed_outlives_the_process_that_started_it(ray_session, synthetic_reference):
    """On the synthetic task: the subject is the feed actor's lifetime, not what its loaders read."""
    config, spec, reference = _config(lifetime="detached"), SYNTHETIC_SPEC, synthetic_reference
    env = dict(os.environ, RAY_AUTH_MODE="token", PYTHONPATH=str(Path(__file__).parents[1]))
    address = ray_session.get_runtime_context().gcs_address
    started = subprocess.run(
        [sys.executable, "-c", _DETACHED_STARTER, address, config.model_dump_json(), spec.model_dump_json()],
        capture_output=True, text=True, timeout=180, env=env,
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        line = next(line for line in started.stdout.splitlines() if line.startswith("RESULT "))
        report = json.loads(line[len("RESULT "):])
        assert report["keys"] == reference[0][:3]
        time.sleep(2)  # the starter's job has ended; its non-detached actors would be gone by now
        rollout, trainer = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S)
        status = rollout.status()
        assert (status["pid"], status["outstanding"], status["totals"]["acked"], status["restarts"]) == (
            report["pid"], 1, 2, [0, 0])
        assert [p.key for p in rollout.take(3)] == reference[0][3:6]  # its rank actors still produce
        assert rollout.status()["restarts"] == [0, 0]
    finally:
        with contextlib.suppress(Exception):
            handle = ray_session.get_actor(config.name, namespace=config.namespace)
            ray_session.get(handle.shutdown.remote(), timeout=TIMEOUT_S)
            ray_session.kill(handle, no_restart=True)
        wait_until_name_is_free(config.name, config.namespace, TIMEOUT_S)


# -- the default name, mixtures ----------------------------------------------------------------


@pytest.mark.slow  # CI runs it (--run-slow); examples/rl_feed_quickstart.py attaches by the default name too
@pytest.mark.timeout(300)
def test_a_feed_left_at_the_default_name_registers_as_the_default_feed_name_and_restores_under_any_name(
    ray_session, tmp_path, synthetic_reference
):
    """The feed of a config whose name was left at the default registers as ``DEFAULT_FEED_NAME``
    (what ``attach_feed`` finds by default), not as the coordinator's default; the name is in no
    identity: its checkpoint restores into a feed of another name."""
    from rl_data.distributed.config import DEFAULT_NAME
    from rl_data.prompt_feed.client import DEFAULT_FEED_NAME

    config = _config().model_copy(update={"name": DEFAULT_NAME})
    handle = start_prompt_feed(config, SYNTHETIC_SPEC, FeedConfig(max_outstanding=8))
    try:
        assert DEFAULT_FEED_NAME == "rl_data_prompt_feed"
        with pytest.raises(ValueError):  # the coordinator's default name stays free
            ray_session.get_actor(DEFAULT_NAME, namespace=NAMESPACE)
        rollout, trainer = attach_feed(namespace=NAMESPACE, timeout_s=TIMEOUT_S)  # the default name
        assert trainer.handle._actor_id == handle._actor_id
        uids = [prompt.uid for prompt in rollout.take(8)]
        trainer.drop(uids[:2], "uniform_reward")
        trainer.ack(uids[2:6])
        trainer.save_checkpoint(str(tmp_path / "data"))
    finally:
        shut_down(ray_session, handle, DEFAULT_FEED_NAME, NAMESPACE)
    renamed = _config()
    with running_feed(ray_session, renamed, SYNTHETIC_SPEC, FeedConfig(max_outstanding=8)) as handle:
        summary = ray_session.get(handle.load_checkpoint.remote(str(tmp_path / "data")), timeout=TIMEOUT_S)
        assert (summary["epochs"][0]["acked"], summary["epochs"][0]["dropped"]) == (4, {"uniform_reward": 2})
        rollout, _ = attach_feed(renamed.name, renamed.namespace, timeout_s=TIMEOUT_S)
        assert [prompt.key for prompt in rollout.take(3)] == synthetic_reference[0][6:9]


@pytest.fixture(scope="module")
def mixture_members(tmp_path_factory) -> dict[str, str]:
    """Two ``rl_prompt`` datasets of 12 different prompts each (the members of a mixture)."""
    adapt = resolve_adapter("gsm8k")
    problems = arithmetic_word_problems(24)
    members = {}
    for index, name in enumerate(("easy", "hard")):
        root = tmp_path_factory.mktemp(f"feed_mixture_{name}")
        samples = [
            (f"{name}-{row:03d}", encode_sample({**adapt(raw), "source": {"file": name, "row": row}}))
            for row, raw in enumerate(problems[12 * index : 12 * index + 12])
        ]
        write_energon_dataset(root, samples, samples_per_shard=4, splits={"train": 1.0})
        members[name] = str(root)
    return members


@pytest.mark.timeout(300)
def test_a_mixture_checkpoint_with_other_weights_is_refused_saying_the_feed_does_not_reweight(ray_session, mixture_members):
    from rl_data.prompt_feed.feed import FEED_REWEIGHT_HINT

    weights = {"easy": 0.7, "hard": 0.3}
    energon = {"task": "rl_prompt", "shuffle_buffer_size": 6, "max_samples_per_sequence": 2}
    mixture = [{"name": name, "path": path, "weight": weights[name]} for name, path in mixture_members.items()]
    spec = LoaderSpec(
        data_config={"energon": energon, "shuffle": True, "task": {"generation_padding": "left"}},
        source={"mixture": mixture, "split": "train", "epoch_mode": "virtual", "virtual_epoch_length": 5},
        batch_size=BATCH, max_sequence_length=256,
    )  # fmt: skip
    config = _config(world=1)  # the refusal is rank 0's: one rank actor (torch, Energon) instead of two
    with running_feed(ray_session, config, spec, FeedConfig(max_outstanding=20)):
        rollout, trainer = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S)
        taken = rollout.take(6)
        trainer.ack([p.uid for p in taken[:3]])
        other_weights = trainer.state_dict()  # as a feed with weights easy=0.4, hard=0.6 would have saved it
        for producer in other_weights["ledger"]["producers"]:
            saved = producer["loader"]["identity"]["mixture"]
            saved["easy"]["weight"], saved["hard"]["weight"] = 0.4, 0.6
        with pytest.raises(ValueError) as refused:
            trainer.load_state_dict(other_weights)
        assert str(refused.value).endswith(
            "rank 0: Energon loader identity changed: mixture.easy.weight 0.4 -> 0.7; mixture.hard.weight 0.6 -> 0.3"
            + FEED_REWEIGHT_HINT
        )
        assert "restore with the weights the checkpoint was saved with" in FEED_REWEIGHT_HINT
        trainer.ack([p.uid for p in taken[3:]])  # refused: the feed serves on as before
        assert [p.uid for p in rollout.take(2)] == [(0, 6), (0, 7)]
