"""The embedded RL prompt data: generated GSM8K-style word problems and the HumanEval prompts."""

from __future__ import annotations

import json
import re

import pytest

from rl_data.prompt_data import TEMPLATES, arithmetic_word_problems, human_eval_prompts, write_gsm8k_rows
from rl_data.rewards import extract_final_answer, ground_truth_from_gsm8k_answer, math_reward

CALCULATION = re.compile(r"<<([-\d+*/ ]+)=(-?\d+)>>(-?\d+)")


def test_same_seed_same_rows_other_seed_other_rows():
    rows = arithmetic_word_problems(60, seed=3)
    assert rows == arithmetic_word_problems(60, seed=3)
    assert arithmetic_word_problems(20, seed=3) == rows[:20]
    assert arithmetic_word_problems(60, seed=4) != rows
    assert arithmetic_word_problems(5)[0]["question"] == (
        "Mateo buys 6 stickers for $10 each and 9 notebooks for $8 each. How many dollars does Mateo spend in total?"
    )


def test_questions_are_unique_and_shapes_take_turns():
    rows = arithmetic_word_problems(3000)
    assert len({row["question"] for row in rows}) == 3000
    shapes = ("spend in total", "of change", "every hour", "at a steady", "shares the rest", "packs of")
    assert len(shapes) == len(TEMPLATES)
    for start in (0, len(TEMPLATES), 2994):
        questions = [row["question"] for row in rows[start : start + len(TEMPLATES)]]
        assert [shape for shape, question in zip(shapes, questions) if shape in question] == list(shapes)
    assert len({row["answer"].count("\n") for row in rows}) == 3  # one-, two- and three-step solutions


def test_more_rows_than_the_templates_can_make_is_refused():
    with pytest.raises(ValueError, match="distinct problems"):
        arithmetic_word_problems(60_000)


def test_every_step_is_exact_integer_arithmetic():
    for row in arithmetic_word_problems(600, seed=1):
        steps = CALCULATION.findall(row["answer"])
        assert steps, row
        for expression, value, shown in steps:
            assert value == shown
            exact = eval(expression.replace("/", "//"))  # noqa: S307 - digits and + - * / only
            assert eval(expression) == exact == int(value), row  # noqa: S307
            assert int(value) >= 0, row
        ground_truth = ground_truth_from_gsm8k_answer(row["answer"])
        assert ground_truth == steps[-1][1] and re.fullmatch(r"\d+", ground_truth), row


def test_every_answer_verifies_and_a_wrong_one_does_not():
    for row in arithmetic_word_problems(300, seed=2):
        ground_truth = ground_truth_from_gsm8k_answer(row["answer"])
        assert math_reward(row["answer"], ground_truth) == 1.0, row
        worked_without_marker = row["answer"].rsplit("\n####", 1)[0]
        assert extract_final_answer(worked_without_marker) == ground_truth, row
        wrong = row["answer"].replace(f"#### {ground_truth}", f"#### {int(ground_truth) + 1}")
        assert math_reward(wrong, ground_truth) == 0.0, row


def test_write_gsm8k_rows(tmp_path):
    path = tmp_path / "raw" / "gsm8k.jsonl"
    assert write_gsm8k_rows(path, 25) == 25
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert rows == arithmetic_word_problems(25)
    assert all(set(row) == {"question", "answer"} for row in rows)
    assert write_gsm8k_rows(str(tmp_path / "as_text.jsonl"), 3) == 3  # a path given as a string
    assert (tmp_path / "as_text.jsonl").read_text(encoding="utf-8").splitlines() == path.read_text(encoding="utf-8").splitlines()[:3]


def test_human_eval_prompts():
    rows = human_eval_prompts()
    assert len(rows) == 164
    assert len({row["extra_env_info"]["task_id"] for row in rows}) == 164
    first = rows[0]
    assert first["task_name"] == "code"
    assert first["extra_env_info"]["task_id"] == "HumanEval/0"
    assert first["extra_env_info"]["entry_point"] == "has_close_elements"
    assert "def has_close_elements(" in first["prompt"]
    assert "def check(candidate):" in first["extra_env_info"]["test"]
    assert all(set(row) == {"prompt", "extra_env_info", "task_name"} for row in rows)
