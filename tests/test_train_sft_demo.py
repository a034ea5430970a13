"""The main job (rl_data.jobs): end to end on the session's Ray, and its pure parts."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from distributed_fixtures import TIMEOUT_S
from rl_data.distributed.client import CoordinatorNotFoundError, get_coordinator
from rl_data.distributed.placement import config_layout, placement_fingerprint
from rl_data.jobs.config import TrainDemoConfig
from rl_data.jobs.data import prepare_dataset
from rl_data.jobs.exactness import compare_continuation
from rl_data.jobs.inspect_checkpoint import load_job_config
from rl_data.jobs.ray_cluster import ClusterInfo, local_cpus, trainer_gpus
from rl_data.jobs.steps import StepRecord
from rl_data.jobs.summary import ZERO_LOSS_WARNING_SHARE, step_totals, zero_loss_line
from rl_data.jobs.trainer import TrainingActor

NAMESPACE = "rl_data_demo_tests"


def loader_batches(config: TrainDemoConfig, tokenizer, steps: int) -> list[list[dict]]:
    """``[step][rank] -> batch`` of an uninterrupted run, read directly from the loaders (no Ray)."""
    from rl_data.energon.sft_dataloader import build_energon_sft_loader

    spec, runtime = config.loader_spec(), config.runtime_config()
    fingerprint = placement_fingerprint(config_layout(runtime))
    per_rank = []
    for rank in range(runtime.world_size):
        loader = build_energon_sft_loader(
            **spec.builder_kwargs(), processor=tokenizer, logical_rank=rank,
            logical_world_size=runtime.world_size, placement_fingerprint=fingerprint,
        )
        batches, iterator = [], iter(loader)
        while len(batches) < steps:
            try:
                batches.append(next(iterator))
            except StopIteration:  # end of a virtual epoch: the stream continues
                iterator = iter(loader)
        per_rank.append(batches)
        loader.close()
    return [[per_rank[r][s] for r in range(runtime.world_size)] for s in range(steps)]


def test_demo_preprocesses_trains_checkpoints_restarts_and_proves_the_continuation(ray_session, tokenizer, tmp_path):
    from rl_data.jobs.sft_demo import run_demo
    from rl_data.preprocess.pipeline import load_dataset_info

    config = TrainDemoConfig(
        work_dir=str(tmp_path / "work"), ranks=2, batch_size=2, seq_len=512, packing="first_fit_decreasing",
        steps=3, resume_steps=2, num_conversations=48, namespace=NAMESPACE, progress=False,
    )
    out = io.StringIO()
    summary = run_demo(config, Console(file=out, width=200))
    text = out.getvalue()

    # The dataset was preprocessed from the packaged chitchat conversations.
    assert summary.preprocessed and summary.dataset == str(tmp_path / "work" / "dataset-chat_sft-48")
    info = load_dataset_info(summary.dataset)
    assert info["counts"]["read"] == 48 and info["counts"]["accepted"] == 48
    assert (tmp_path / "work" / "raw" / "chat_sft-48.jsonl").read_text().count("\n") == 48

    # What the trainers consumed equals the loaders' own stream, before and after the restore.
    expected = loader_batches(config, tokenizer, config.steps + config.resume_steps)
    expected_ids = [[[list(ids) for ids in b["source_ids"]] for b in step] for step in expected]
    assert summary.reference_ids == expected_ids[3:5]
    assert summary.resumed_ids == expected_ids[3:5]
    assert summary.passed
    assert summary.verdict == (
        "PASS: the resumed run reproduced all 2 steps x 2 ranks after the checkpoint exactly "
        "(same sample ids, same order)"
    )

    # Totals over the 3 + 2 steps of run 1 and the 2 steps of run 2.
    consumed = expected + expected[3:5]
    metrics = [m for step in consumed for batch in step for m in batch["packing_metrics"]]
    totals = summary.totals
    assert totals.steps == 7
    assert totals.samples == sum(len(ids) for step in consumed for b in step for ids in b["source_ids"])
    assert totals.tokens == sum(m["tokens"] for m in metrics)
    assert totals.trained_tokens == sum(int(b["token_mask"].sum()) for step in consumed for b in step)
    assert totals.zero_loss_samples == sum(m["zero_loss_sequences"] for m in metrics)
    assert totals.packing_efficiency == pytest.approx(sum(m["tokens"] for m in metrics) / (512 * len(metrics)))
    assert summary.skipped_samples == 0 and summary.devices == ["cpu", "cpu"]

    # The checkpoint is the one after step 3; the job config file describes the job.
    checkpoint = tmp_path / "work" / "checkpoint" / "rl_data_state.pt"
    assert summary.checkpoint_path == str(checkpoint) and summary.checkpoint_step == 3
    assert torch.load(checkpoint, weights_only=True)["content"]["step"] == 3
    job = load_job_config(tmp_path / "work" / "job_config.json")
    assert (job.runtime, job.loader) == (config.runtime_config(), config.loader_spec())

    # Printed: the encoded conversation, the summary, the verdict; nothing is left running.
    for line in ("one encoded conversation", "Flattened SFT batch", "train_sft_demo summary", "packing efficiency", summary.verdict):
        assert line in text, line
    with pytest.raises(CoordinatorNotFoundError):
        get_coordinator(config.coordinator_name, NAMESPACE)


def _message_log_batch(batch, tokenizer, config):
    """The batch the same loader gives with ``batch_format="message_log"``."""
    from rl_data.energon.sft_dataloader import build_energon_sft_loader

    spec, runtime = config.loader_spec(), config.runtime_config()
    kwargs = spec.builder_kwargs()
    kwargs["data_config"] = kwargs["data_config"].model_copy(update={"batch_format": "message_log"})
    loader = build_energon_sft_loader(
        **kwargs, processor=tokenizer, logical_rank=0, logical_world_size=1,
        placement_fingerprint=placement_fingerprint(config_layout(runtime)),
    )
    logged = next(iter(loader))
    loader.close()
    assert logged["source_ids"] == batch["source_ids"]
    return logged


@pytest.mark.parametrize("batch_format", ["tensors", "message_log"])
def test_training_actor_flattens_message_logs_and_reports_what_it_consumed(ray_session, energon_dataset, tokenizer, tmp_path, batch_format):
    from rl_data.tokenization.flatten import sft_batch_tensors
    from rl_data.tokenization.loss_mask import add_loss_mask_to_message_log

    config = TrainDemoConfig(data=energon_dataset.path, work_dir=str(tmp_path), ranks=1, batch_size=3, seq_len=256)
    tensors_batch = loader_batches(config, tokenizer, 1)[0][0]
    logged = _message_log_batch(tensors_batch, tokenizer, config)
    batch = tensors_batch if batch_format == "tensors" else logged
    trainer = TrainingActor(rank=0, pad_token_id=tokenizer.pad_token_id)
    report = trainer.train_step(1, [ray_session.put(batch)], timeout_s=TIMEOUT_S)

    logs = [[dict(m) for m in log] for log in logged["message_log"]]
    add_loss_mask_to_message_log(logs)
    flat = sft_batch_tensors(logs, batch["loss_multiplier"].tolist(), pad_token_id=tokenizer.pad_token_id)
    assert report["source_ids"] == list(batch["source_ids"]) and len(report["source_ids"]) == 3
    assert report["tokens"] == int(flat["input_lengths"].sum())
    assert report["trained_tokens"] == int(flat["token_mask"].sum()) > 0
    assert report["pack_capacity"] == 0 and (report["rank"], report["step"]) == (0, 1)
    again = TrainingActor(rank=0, pad_token_id=tokenizer.pad_token_id).train_step(1, [ray_session.put(batch)])
    assert 0 < report["loss"] == again["loss"]  # fixed seed: same batch, same loss
    assert report["zero_loss_samples"] == 0
    batch["loss_multiplier"][1] = 0.0  # as if the second conversation had been over length
    assert trainer.train_step(2, [ray_session.put(batch)], timeout_s=TIMEOUT_S)["zero_loss_samples"] == 1


def test_existing_dataset_is_reused_and_a_folder_that_is_no_dataset_is_refused(energon_dataset, tmp_path):
    reused = prepare_dataset(TrainDemoConfig(data=energon_dataset.path, work_dir=str(tmp_path)))
    assert (reused.path, reused.preprocessed) == (energon_dataset.path, False)
    (tmp_path / "not_a_dataset").mkdir()
    with pytest.raises(ValueError, match=rf"--data {tmp_path}/not_a_dataset exists but is not an Energon dataset \(no \.nv-meta folder\)"):
        prepare_dataset(TrainDemoConfig(data=str(tmp_path / "not_a_dataset"), work_dir=str(tmp_path)))
    assert not (tmp_path / "raw").exists()


def test_config_defaults_and_validation(tmp_path):
    config = TrainDemoConfig(work_dir=str(tmp_path / "w"))
    assert config.checkpoint_dir == str(tmp_path / "w" / "checkpoint")
    assert config.dataset_path == str(tmp_path / "w" / "dataset-chat_sft-256")
    spec = config.loader_spec()
    assert spec.packing_algorithm is None and spec.data_config.energon.packing_buffer_size is None
    assert spec.data_config.energon.task == "chat_sft"
    packed = TrainDemoConfig(work_dir=str(tmp_path), packing="First_Fit_Decreasing", batch_size=3)
    assert packed.packing == "first_fit_decreasing"
    assert packed.loader_spec().data_config.energon.packing_buffer_size == 12
    assert TrainDemoConfig(packing="none").packing is None
    assert config.runtime_config().parallel_layout.dp == 2 and config.runtime_config().namespace == "rl_data"
    with pytest.raises(ValueError, match=r"unknown task 'vlm'; choose one of \['chat_sft', 'preference', 'vlm_sft'\]"):
        TrainDemoConfig(task="vlm")
    with pytest.raises(ValueError, match=r"unknown packing algorithm 'best_fit'; choose one of \['concatenative', "):
        TrainDemoConfig(packing="best_fit")
    with pytest.raises(ValueError, match="extra_forbidden|Extra inputs"):
        TrainDemoConfig(rank=2)


def test_compare_continuation_lists_every_difference():
    reference = [(4, [["a", "b"], ["c", "d"]]), (5, [["e", "f"], ["g", "h"]])]
    assert compare_continuation(reference, reference).passed
    resumed = [(4, [["a", "b"], ["c", "d"]]), (6, [["e", "f"], ["h", "g"]])]
    check = compare_continuation(reference, resumed)
    assert not check.passed
    assert check.mismatches == ["step number 6, expected 5", "step 5 rank 1: got ['h', 'g'], expected ['g', 'h']"]
    assert check.verdict() == (
        "FAIL: 2 differences after the restore: step number 6, expected 5; "
        "step 5 rank 1: got ['h', 'g'], expected ['g', 'h']"
    )
    short = compare_continuation(reference, reference[:1])
    assert short.mismatches == ["the reference has 2 steps, the resumed run 1"]
    assert compare_continuation([], []).verdict() == "FAIL: no steps were compared"


def test_the_embedded_default_stays_below_its_own_zero_loss_warning(tokenizer):
    """The warning is for users' own settings: at the default sequence length, the default data
    (the first ``num_conversations`` chitchat conversations, as the loader encodes them) loses less
    than ``ZERO_LOSS_WARNING_SHARE`` of its samples to the over-length rule."""
    from rl_data.sample_data import chitchat_conversations
    from rl_data.tokenization.chat import get_formatted_message_log
    from rl_data.tokenization.truncation import message_log_length

    config = TrainDemoConfig()
    lengths = [message_log_length(get_formatted_message_log(c["messages"], tokenizer))
               for c in chitchat_conversations(config.num_conversations)]  # fmt: skip
    over = sum(length >= config.seq_len for length in lengths)
    assert len(lengths) == config.num_conversations
    assert 0 < over / len(lengths) < ZERO_LOSS_WARNING_SHARE  # some are cut (the rule is shown), few


def test_step_totals_and_resource_choices():
    def report(ids, tokens, capacity, zero_loss=0):
        return {"source_ids": ids, "tokens": tokens, "trained_tokens": tokens // 2, "pack_capacity": capacity,
                "zero_loss_samples": zero_loss}

    packed = [StepRecord(1, [report([["a", "b"], ["c"]], 300, 1024, 1), report([["d"]], 100, 512)], 0.5)]
    totals = step_totals(packed)
    assert (totals.steps, totals.samples, totals.tokens, totals.trained_tokens) == (1, 4, 400, 200)
    assert totals.zero_loss_samples == 1
    assert zero_loss_line(totals) == (
        "1 of 4 (25.0%) over the sequence length, cut, loss 0 - WARNING: that much training signal is lost; "
        "raise --seq-len or filter long conversations"
    )
    quiet = step_totals([StepRecord(1, [report([str(i) for i in range(40)], 10, 0, 2)], 1.0)])
    assert zero_loss_line(quiet) == "2 of 40 (5.0%) over the sequence length, cut, loss 0"
    assert totals.packing_efficiency == 400 / 1536 and totals.tokens_per_s == 800
    assert step_totals([StepRecord(1, [report(["a", "b"], 10, 0)], 1.0)]).packing_efficiency is None

    config = TrainDemoConfig(ranks=4)
    assert local_cpus(config) >= 5  # 4 x (0.5 rank + 0.25 trainer) + 2 headroom
    no_gpu, gpus = ClusterInfo(True, 8, 0, None), ClusterInfo(False, 8, 4, "http://x:8265")
    assert (trainer_gpus(config, no_gpu), trainer_gpus(config, gpus)) == (0.0, 1.0)
    assert trainer_gpus(TrainDemoConfig(ranks=8), gpus) == 0.0  # fewer GPUs than ranks: CPU
    assert trainer_gpus(TrainDemoConfig(ranks=8, trainer_gpus=0.5), no_gpu) == 0.5


def test_pipeline_script_is_thin_and_json_of_the_job_config_round_trips(tmp_path):
    from rl_data.jobs.inspect_checkpoint import write_job_config

    script = (Path(__file__).parents[1] / "pipelines" / "train_sft_demo.py").read_text()
    assert "typer.run(train_sft_demo)" in script and len(script.splitlines()) < 40
    config = TrainDemoConfig(work_dir=str(tmp_path), packing="greedy_knapsack")
    path = write_job_config(tmp_path / "job.json", config.runtime_config(), config.loader_spec())
    assert json.loads(path.read_text())["loader"]["packing_algorithm"] == "greedy_knapsack"
    assert load_job_config(path).loader == config.loader_spec()


def test_tokenizer_and_task_prompts_reach_the_loader_spec(tokenizer, tmp_path):
    from rl_data.tokenization.tokenizer import load_tokenizer

    folder = tmp_path / "my_tokenizer"
    tokenizer.save_pretrained(folder)
    (tmp_path / "prompt.txt").write_text("Answer kindly: {}", encoding="utf-8")
    config = TrainDemoConfig(work_dir=str(tmp_path), tokenizer=str(folder), prompt_file=str(tmp_path / "prompt.txt"),
                             system_prompt_file=str(tmp_path / "prompt.txt"))
    spec = config.loader_spec()
    assert (spec.processor_factory, spec.processor_factory_kwargs) == (
        "rl_data.tokenization.tokenizer:load_tokenizer", {"name_or_path": str(folder)})
    assert spec.data_config.prompt == spec.data_config.system_prompt == "Answer kindly: {}"  # texts, read here
    loaded = spec.load_processor_factory()()
    assert loaded.name_or_path == str(folder) and loaded.get_vocab() == tokenizer.get_vocab()
    assert TrainDemoConfig(work_dir=str(tmp_path)).loader_spec().processor_factory_kwargs == {}
    with pytest.raises(ValueError, match="--tokenizer .* works with text tasks only"):
        TrainDemoConfig(task="vlm_sft", tokenizer=str(folder))
    with pytest.raises(ValueError, match="no such tokenizer|neither 'qwen3' nor a local folder"):
        load_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=r"^unknown task 'rl_prompt'|has no SFT demo data"):
        TrainDemoConfig(task="rl_prompt")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_on_a_mixture_resumes_at_another_dp_size_with_the_same_global_batches(ray_session, tmp_path):
    from rl_data.jobs.sft_demo import run_demo

    # 2 logical shards: one per DP rank in run 1, both on the one DP rank of run 2 (4 shards at DP 2, 1 and 4:
    # test_elastic_resume.py)
    config = TrainDemoConfig(
        work_dir=str(tmp_path / "work"), ranks=2, logical_shards=2, resume_ranks=1, mixture={"small": 0.7, "big": 0.3},
        batch_size=2, seq_len=512, steps=3, resume_steps=2, num_conversations=64, namespace=NAMESPACE, progress=False,
    )  # fmt: skip
    assert config.runtime_config(1).world_size == config.runtime_config(2).world_size == 2
    assert (config.runtime_config(1).parallel_layout.dp, config.runtime_config(2).parallel_layout.dp) == (2, 1)
    out = io.StringIO()
    summary = run_demo(config, Console(file=out, width=200))
    assert summary.dataset.endswith("mixture.yaml") and summary.preprocessed
    assert summary.passed, out.getvalue()
    assert summary.verdict.startswith("PASS: the resumed run at another DP size (1 ranks) reproduced the global batch of all 2 steps")
    # run 1 handed out 2 DP batches per step (a shard each), the resumed run 1 batch of both shards
    assert [len(step) for step in summary.reference_ids] == [2, 2] and [len(step) for step in summary.resumed_ids] == [1, 1]
    for reference, resumed in zip(summary.reference_ids, summary.resumed_ids):
        assert sorted(i for rank in reference for i in rank) == sorted(resumed[0]) and len(resumed[0]) == 2 * 2
    with pytest.raises(ValueError, match=r"parallel_layout.dp=3 does not divide the 4 logical data shards"):
        TrainDemoConfig(work_dir=str(tmp_path), ranks=2, logical_shards=4, resume_ranks=3)
