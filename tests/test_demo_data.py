"""The main job's vlm_sft and preference tasks: their raw rows, and the job end to end on them."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from rl_data.distributed.placement import config_layout, placement_fingerprint
from rl_data.jobs.config import TrainDemoConfig
from rl_data.demo_data import COLORS, preference_rows, shape_picture, shape_question_row, write_shape_question_rows
from rl_data.task_registry import get_task

NAMESPACE = "rl_data_task_tests"


def test_shape_pictures_and_their_questions(tmp_path):
    picture = shape_picture("square", "blue", (84, 56), seed=3)
    assert picture.size == (84, 56) and picture.getpixel((0, 0)) == (255, 255, 255)
    assert COLORS["blue"] in {color for _, color in picture.getcolors()}
    circle = shape_picture("circle", "red", (56, 56), seed=0)
    assert {color for _, color in circle.getcolors()} >= {COLORS["red"], (255, 255, 255)}

    row, (shape, color, size) = shape_question_row(14, "imgs/00014.png")
    assert (shape, color, size) == ("triangle", "red", (56, 84))
    assert row["messages"] == [
        {"role": "user", "content": [{"type": "image", "image": "imgs/00014.png"}, {"type": "text", "text": "Which shape do you see?"}]},
        {"role": "assistant", "content": "A triangle."},
    ]
    assert write_shape_question_rows(tmp_path / "raw" / "shapes.jsonl", 3) == 3
    rows = [json.loads(line) for line in (tmp_path / "raw" / "shapes.jsonl").read_text().splitlines()]
    assert [r["messages"][1]["content"] for r in rows] == ["It is red.", "It is red.", "It is red."]
    assert sorted(p.name for p in (tmp_path / "raw" / "shapes-images").iterdir()) == ["00000.png", "00001.png", "00002.png"]


def test_preference_rows_pair_a_reply_with_another_conversations_reply():
    def conversation(tag, turns):
        return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{tag}{i}"} for i in range(turns)]

    rows = preference_rows([conversation("a", 4), conversation("b", 2), conversation("c", 5), [{"role": "assistant", "content": "x"}]])
    assert rows == [
        {"prompt": conversation("a", 1), "chosen": "a1", "rejected": "b1"},  # b has no turn 3
        {"prompt": conversation("b", 1), "chosen": "b1", "rejected": "c1"},
        {"prompt": conversation("c", 3), "chosen": "c3", "rejected": "a3"},
    ]


def test_task_selection_sets_encoder_processor_and_packing_rules(tmp_path):
    vlm = TrainDemoConfig(task="vlm_sft", work_dir=str(tmp_path), packing="first_fit_decreasing").loader_spec()
    assert vlm.data_config.energon.task == "vlm_sft"
    assert vlm.processor_factory == "rl_data.energon.multimodal.task_encoders.processor:load_default_multimodal_processor"
    preference = TrainDemoConfig(task="preference", work_dir=str(tmp_path)).loader_spec()
    assert preference.data_config.energon.task == "preference"
    assert get_task("preference").demo.adapter == "preference"
    with pytest.raises(ValueError, match=r"task 'preference' does not pack sequences \(found packing='first_fit_decreasing'\); leave --packing unset"):
        TrainDemoConfig(task="preference", packing="first_fit_decreasing")


def _loader_ids(config: TrainDemoConfig, processor, steps: int) -> list[list[list]]:
    """``[step][rank] -> source ids`` read directly from the loaders (no Ray)."""
    from rl_data.energon.sft_dataloader import build_energon_sft_loader

    spec, runtime = config.loader_spec(), config.runtime_config()
    per_rank = []
    for rank in range(runtime.world_size):
        loader = build_energon_sft_loader(
            **spec.builder_kwargs(), processor=processor, logical_rank=rank,
            logical_world_size=runtime.world_size, placement_fingerprint=placement_fingerprint(config_layout(runtime)),
        )
        ids, iterator = [], iter(loader)
        while len(ids) < steps:
            ids.append([list(i) if isinstance(i, list) else i for i in next(iterator)["source_ids"]])
        per_rank.append(ids)
    return [[per_rank[r][s] for r in range(runtime.world_size)] for s in range(steps)]


@pytest.mark.slow  # the tasks through the runtime: test_runtime_multimodal_preference.py; task selection: above
@pytest.mark.timeout(300)
@pytest.mark.parametrize("task,packing", [("vlm_sft", "first_fit_decreasing"), ("preference", None)])
def test_the_job_runs_the_task_and_proves_the_continuation(ray_session, tmp_path, task, packing):
    from rl_data.jobs.sft_demo import run_demo
    from rl_data.preprocess.pipeline import load_dataset_info

    # 1 DP rank: the job's path per task; 2 logical ranks over both tasks restore and continue exactly
    # in test_runtime_multimodal_preference.py, 2 ranks of the job in test_train_sft_demo.py
    config = TrainDemoConfig(
        task=task, work_dir=str(tmp_path / "work"), ranks=1, batch_size=2, seq_len=256, packing=packing,
        steps=2, resume_steps=1, num_conversations=40, prefetch_depth=1, namespace=NAMESPACE,
        show_encoding=False, progress=False,
    )
    out = io.StringIO()
    summary = run_demo(config, Console(file=out, width=200))
    assert summary.passed, out.getvalue()[-3000:]
    info = load_dataset_info(summary.dataset)
    assert info["counts"]["read"] == info["counts"]["accepted"] == 40
    processor = config.loader_spec().load_processor_factory()()
    assert summary.resumed_ids == _loader_ids(config, processor, 3)[2:]
    assert summary.totals.tokens > 0 and summary.skipped_samples == 0
