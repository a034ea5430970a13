"""``rl-data`` commands through typer's CliRunner: inspect-checkpoint on a real checkpoint, demo, views."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from distributed_fixtures import TIMEOUT_S, consume, running_coordinator, runtime_config, train_spec
from rl_data.cli import app
from rl_data.distributed.placement import config_layout, placement_fingerprint
from rl_data.fingerprint import fingerprint as identity_fingerprint
from rl_data.jobs.inspect_checkpoint import write_job_config

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})


@pytest.fixture(scope="module")
def checkpoint(ray_session, energon_dataset, tmp_path_factory):
    """``(directory, job config file, runtime config, spec)`` after 2 committed steps of 2 ranks."""
    directory = tmp_path_factory.mktemp("cli_checkpoint")
    config, spec = runtime_config(2, 1, name="cli_coordinator"), train_spec(energon_dataset)
    with running_coordinator(ray_session, config, spec) as coordinator:
        consume(ray_session, coordinator, 2)
        ray_session.get(coordinator.save_checkpoint.remote(str(directory / "ckpt")), timeout=TIMEOUT_S)
    job_file = write_job_config(directory / "job_config.json", config, spec)
    return directory / "ckpt", job_file, config, spec


def test_inspect_checkpoint_prints_step_ranks_fingerprints_and_identity(checkpoint):
    directory, _, config, _ = checkpoint
    content = torch.load(directory / "rl_data_state.pt", weights_only=True)["content"]
    fingerprint = placement_fingerprint(config_layout(config))
    result = invoke("inspect-checkpoint", str(directory))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[:9] == [
        f"checkpoint: {directory / 'rl_data_state.pt'}",
        "format: rl_data.distributed.coordinator v1",
        "step: 2",
        "ranks: 2",
        f"placement fingerprint: {fingerprint}",
        "placement layout: " + json.dumps(config_layout(config), sort_keys=True),
        'consumer layout when saved: {"cp": 1, "dp": 2, "pp": 1, "tp": 1} (restores at any dp dividing 2)',
        f"rank 0: identity fingerprint {identity_fingerprint(content['ranks'][0]['identity'])} (logical rank 0 of 2)",
        f"rank 1: identity fingerprint {identity_fingerprint(content['ranks'][1]['identity'])} (logical rank 1 of 2)",
    ]
    assert lines[9] == "identity (rank 0):"
    assert json.loads("\n".join(lines[10:])) == content["ranks"][0]["identity"]
    assert invoke("inspect-checkpoint", str(directory / "rl_data_state.pt")).output == result.output


def test_inspect_checkpoint_against_the_same_config_would_restore(checkpoint):
    directory, job_file, _, _ = checkpoint
    result = invoke("inspect-checkpoint", str(directory), "--against", str(job_file))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == (
        f"against {job_file}: would restore (placement layout and all 2 rank identities match)"
    )


def test_inspect_checkpoint_against_another_config_lists_the_refusing_differences(checkpoint, tmp_path):
    directory, job_file, config, spec = checkpoint
    changed = json.loads(job_file.read_text())
    changed["runtime"]["bundle_resources"] = {"CPU": 0.5}
    changed["runtime"]["rank_actor_num_cpus"] = 0.5
    changed["loader"]["batch_size"] = 3
    against = tmp_path / "changed.yaml"
    against.write_text(yaml.safe_dump(changed))
    old = placement_fingerprint(config_layout(config))
    new = placement_fingerprint(config_layout(config.model_copy(update={"bundle_resources": {"CPU": 0.5}})))

    result = invoke("inspect-checkpoint", str(directory), "--against", str(against))
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[-6:] == [
        f"against {against}: would be REFUSED (5 differences, saved -> configured):",
        "  placement layout: bundles [{'CPU': 0.25}, {'CPU': 0.25}] -> [{'CPU': 0.5}, {'CPU': 0.5}]",
        "  rank 0 identity: batch_size 2 -> 3",
        f"  rank 0 identity: topology.placement '{old}' -> '{new}'",
        "  rank 1 identity: batch_size 2 -> 3",
        f"  rank 1 identity: topology.placement '{old}' -> '{new}'",
    ]


def test_inspect_checkpoint_against_another_dp_size_and_tp_would_restore(checkpoint, tmp_path):
    directory, job_file, _, _ = checkpoint
    changed = json.loads(job_file.read_text())
    changed["runtime"]["parallel_layout"] = {"dp": 1, "tp": 2, "pp": 1, "cp": 1}
    changed["runtime"]["logical_world_size"] = 2  # the 2 logical shards of the checkpoint, now fed to 1 DP rank
    against = tmp_path / "elastic.json"
    against.write_text(json.dumps(changed))
    result = invoke("inspect-checkpoint", str(directory), "--against", str(against))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1].endswith("would restore (placement layout and all 2 rank identities match)")


def test_inspect_checkpoint_of_a_missing_directory_fails_with_the_path(tmp_path):
    result = invoke("inspect-checkpoint", str(tmp_path / "nothing"))
    assert result.exit_code == 1
    assert result.output.startswith(f"no rl_data checkpoint file at {tmp_path}/nothing/rl_data_state.pt: expected")


def test_demo_and_run_list_every_job_flag():
    flags = ["--task", "--data", "--work-dir", "--ranks", "--batch-size", "--seq-len", "--packing", "--steps",
             "--resume-steps", "--checkpoint-dir", "--namespace", "--prefetch-depth", "--num-conversations",
             "--trainer-gpus", "--show-encoding", "--progress"]
    for command in ("demo", "run"):
        result = invoke(command, "--help")
        assert result.exit_code == 0, result.output
        missing = [flag for flag in flags if flag not in result.output]
        assert not missing, (command, missing)


def test_demo_exits_1_when_the_continuation_differs_and_2_on_a_bad_option(monkeypatch, tmp_path):
    import rl_data.jobs.sft_demo as sft_demo

    class Failed:
        passed = False

    seen = []
    monkeypatch.setattr(sft_demo, "run_demo", lambda config: seen.append(config) or Failed())
    result = invoke("demo", "--work-dir", str(tmp_path), "--ranks", "3", "--packing", "greedy_knapsack")
    assert result.exit_code == 1, result.output
    assert (seen[0].ranks, seen[0].packing, seen[0].work_dir) == (3, "greedy_knapsack", str(tmp_path))

    result = invoke("demo", "--task", "video_sft")
    assert result.exit_code == 2
    assert "unknown task 'video_sft'; choose one of ['chat_sft', 'preference', 'vlm_sft']" in " ".join(result.output.split())
    result = invoke("demo", "--task", "preference", "--packing", "first_fit_decreasing")
    assert result.exit_code == 2
    assert "task 'preference' does not pack sequences" in " ".join(result.output.split())


def test_show_conversations_prints_the_readable_message_logs_and_batch():
    result = invoke("show-conversations", "--num-conversations", "1", "--max-rows", "3")
    assert result.exit_code == 0, result.output
    for text in ("chitchat", "system prompt, multilingual", "tool call", "TRUNCATED (loss multiplier 0)",
                 "trained", "masked", "Flattened SFT batch"):
        assert text in result.output, text


def test_build_tokenizer_and_preprocess_are_still_there():
    for command in ("build-tokenizer", "preprocess"):
        assert invoke(command, "--help").exit_code == 0
