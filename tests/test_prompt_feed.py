"""The prompt feed runtime on real local Ray, a real ``rl_prompt`` Energon dataset and the real tokenizer.

Every test compares what the feed handed out with a reference read directly from the same
loaders in the test process (no Ray): epoch e is pass e of every rank, merged item by item
round-robin (:mod:`rl_data.prompt_feed.merge`), so uid ``(e, p)`` must carry reference key
``reference[e][p]``.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from distributed_fixtures import TIMEOUT_S, runtime_config

from rl_data.distributed.client import wait_until_name_is_free
from rl_data.distributed.config import LoaderSpec, RuntimeConfig
from rl_data.distributed.placement import config_layout, placement_fingerprint
from rl_data.energon.dataset_writer import write_energon_dataset
from rl_data.energon.sample_format import encode_sample
from rl_data.preprocess.adapters import resolve_adapter
from rl_data.prompt_data import arithmetic_word_problems
from rl_data.prompt_feed import Uid, UidStateError
from rl_data.prompt_feed.client import attach_feed
from rl_data.prompt_feed.feed import FeedConfig, check_prompt_spec, start_prompt_feed

#: 40 prompts in 10 shards, all train; 2 ranks x 20 prompts, batches of 4: no partial batch,
#: so every epoch holds all 40 prompts (in a new order).
PROMPTS, WORLD, BATCH = 40, 2, 4
NAMESPACE = "rl_data_feed_tests"


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


def _spec(root: str, **source: Any) -> LoaderSpec:
    energon = {"task_encoder": "rl_prompt", "num_workers": 0, "shuffle_buffer_size": 6, "max_samples_per_sequence": 2}
    return LoaderSpec(
        data_config={"energon": energon, "shuffle": True, "task": {"generation_padding": "left"}},
        source={"path": root, "split": "train", **source},
        batch_size=BATCH,
        max_sequence_length=256,
    )


def _config(world: int = WORLD, **overrides: Any) -> RuntimeConfig:
    return runtime_config(world, 2, namespace=NAMESPACE, name=f"feed-{uuid.uuid4().hex[:8]}", **overrides)


@pytest.fixture(scope="module")
def reference(prompt_root, tokenizer) -> list[list[str]]:
    """``[epoch][position] -> key`` for 3 epochs of the 2-rank feed, read from the loaders directly."""
    from rl_data.energon.sft_dataloader import build_energon_sft_loader

    spec, config = _spec(prompt_root), _config()
    passes = []
    for rank in range(WORLD):
        loader = build_energon_sft_loader(
            **spec.builder_kwargs(), processor=tokenizer, logical_rank=rank, logical_world_size=WORLD,
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
        with contextlib.suppress(Exception):
            ray.get(handle.shutdown.remote(), timeout=TIMEOUT_S)
        ray.kill(handle, no_restart=True)
        wait_until_name_is_free(config.name, config.namespace, TIMEOUT_S)


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
    deadline = time.monotonic() + 30
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
    with pytest.raises(ValueError, match=r"epoch_mode 'exact' and virtual_epoch_length 5, expected 0"):
        check_prompt_spec(_spec(str(tmp_path), virtual_epoch_length=5))
    validation = _spec(str(tmp_path)).model_copy(update={"split_role": "validation"})
    with pytest.raises(ValueError, match=r"^a prompt feed needs RL prompts in exact passes or one endless epoch: split_role is 'validation'"):
        check_prompt_spec(validation)
    sft = LoaderSpec(data_config={"energon": {"task_encoder": "chat_sft"}}, source={"path": str(tmp_path), "split": "train"},
                     batch_size=BATCH, max_sequence_length=256)
    with pytest.raises(ValueError, match=r"task_encoder is 'chat_sft', expected 'rl_prompt'$"):
        check_prompt_spec(sft)


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
        with pytest.raises(Exception, match=r"load_state_dict after take was called"):
            ray_session.get(second.load_checkpoint.remote(str(tmp_path)), timeout=TIMEOUT_S)
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
def test_killed_rank_actors_are_replaced_without_losing_or_repeating_a_prompt(ray_session, metrics_port, prompt_root, reference):
    config = _config()
    with running_feed(ray_session, config, _spec(prompt_root), FeedConfig(max_outstanding=100)):
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
def test_release_holder_gives_back_what_a_dead_worker_held_except_the_results_already_delivered(ray_session, prompt_root):
    config = _config()
    with running_feed(ray_session, config, _spec(prompt_root), FeedConfig(max_outstanding=20)):
        worker_a, trainer = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S, holder="worker-a")
        worker_b, _ = attach_feed(config.name, config.namespace, timeout_s=TIMEOUT_S, holder="worker-b")
        a, b = worker_a.take(5), worker_b.take(3)
        anonymous = ray_session.get(trainer.handle.take.remote(2), timeout=TIMEOUT_S)  # nobody's
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
        assert worker_a.status()["outstanding_by_holder"] == {"worker-a": 1, "worker-b": 3}
        again = worker_b.take(3)  # released prompts first, in uid order
        assert [p.uid for p in again] == sorted([a[1].uid, a[3].uid, a[4].uid])
        trainer.ack(delivered + [p.uid for p in b + again + anonymous])
        status = worker_a.status()
        assert status["outstanding"] == 0 and status["outstanding_by_holder"] == {}
        with pytest.raises(Exception, match="take holder must be a non-empty string"):
            ray_session.get(trainer.handle.take.remote(1, None, ""), timeout=TIMEOUT_S)
