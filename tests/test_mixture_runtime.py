"""A mixture through the coordinator (real Ray): refused and explicit re-weighting, and what
``rl-data inspect-checkpoint`` shows of it."""

from __future__ import annotations

import pytest
from distributed_fixtures import TIMEOUT_S, consume, running_coordinator, runtime_config
from energon_fixtures import write_chat_dataset
from typer.testing import CliRunner

from rl_data.cli import app
from rl_data.distributed.client import CoordinatorClient
from rl_data.distributed.config import LoaderSpec

WEIGHTS = {"math": 0.5, "code": 0.3, "chat": 0.2}


@pytest.fixture(scope="module")
def members(tmp_path_factory, chat_conversations):
    return {
        name: write_chat_dataset(tmp_path_factory.mktemp(f"rt_mixture_{name}"), chat_conversations[200 * i : 200 * i + 200],
                                 samples_per_shard=20, splits={"train": 1.0})
        for i, name in enumerate(WEIGHTS)
    }  # fmt: skip


def _spec(members, weights):
    mixture = [{"name": n, "path": str(members[n].path), "weight": w} for n, w in weights.items()]
    return LoaderSpec(
        data_config={"energon": {"shuffle_buffer_size": 8, "max_samples_per_sequence": 4}, "shuffle": True},
        source={"mixture": mixture, "split": "train", "epoch_mode": "virtual", "virtual_epoch_length": 10},
        batch_size=4, max_sequence_length=256,
    )


@pytest.mark.timeout(400)
def test_reweighting_through_the_coordinator_is_refused_unless_asked_and_recorded(ray_session, members, tmp_path):
    ray = ray_session
    # one rank: re-weighting is each rank loader's own (the refusal and the record name rank 0), and
    # a coordinator's rank actor (torch, Energon) is most of this test's cost
    config = runtime_config(1, 1, name="mixture_coordinator")
    with running_coordinator(ray, config, _spec(members, WEIGHTS)) as coordinator:
        before = consume(ray, coordinator, 3)
        ray.get(coordinator.save_checkpoint.remote(str(tmp_path / "ckpt")), timeout=TIMEOUT_S)
        status = ray.get(coordinator.status.remote(), timeout=TIMEOUT_S)
    assert [sum(r["mixture"]["counts"].values()) for r in status["ranks"]] == [12]  # 3 batches of 4

    result = CliRunner().invoke(app, ["inspect-checkpoint", str(tmp_path / "ckpt")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"mixture: math=0.5 ({members['math'].path}), code=0.3 ({members['code'].path}), chat=0.2 ({members['chat'].path})" in lines
    rank_lines = [line for line in lines if line.startswith("rank 0 mixture: ")]
    assert len(rank_lines) == 1 and rank_lines[0].startswith("rank 0 mixture: 3 batches; samples math ")
    assert rank_lines[0].endswith("; weights math=0.5 code=0.3 chat=0.2 from batch 0")

    new = {"math": 0.2, "code": 0.3, "chat": 0.5}
    with running_coordinator(ray, config, _spec(members, new)) as coordinator:
        with pytest.raises(ValueError) as refused:  # the loader's own hint, as an RL loop restores it
            ray.get(coordinator.load_checkpoint.remote(str(tmp_path / "ckpt")), timeout=TIMEOUT_S)
        assert str(refused.value).endswith(
            "rank 0: Energon loader identity changed: mixture.chat.weight 0.2 -> 0.5; mixture.math.weight 0.5 -> 0.2; "
            "only mixture weights changed: to continue with the new weights from each member's restored position, "
            "restore with reweight=True"
        )
        client = CoordinatorClient(coordinator, timeout_s=TIMEOUT_S)
        assert client.load_checkpoint(str(tmp_path / "ckpt"), reweight=True) == 3
        after = consume(ray, coordinator, 3)
        ray.get(coordinator.save_checkpoint.remote(str(tmp_path / "ckpt2")), timeout=TIMEOUT_S)
    ids = [i for step in before + after for rank in step for i in rank]
    assert len(ids) == len(set(ids)) == 24  # each member continued where it stood: nothing twice
    result = CliRunner().invoke(app, ["inspect-checkpoint", str(tmp_path / "ckpt2")])
    rank_line = next(line for line in result.output.splitlines() if line.startswith("rank 0 mixture: "))
    assert rank_line.startswith("rank 0 mixture: 6 batches; samples ")
    assert rank_line.endswith("weights math=0.5 code=0.3 chat=0.2 from batch 0, math=0.2 code=0.3 chat=0.5 from batch 3")
