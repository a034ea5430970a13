"""Final-answer extraction and the Math-Verify reward, in the main thread and in other threads."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from math_verify import parse

from rl_data.rewards import MAX_ANSWER_CHARS, extract_final_answer, ground_truth_from_gsm8k_answer, math_reward

#: Math-Verify computes this number for hours unless its timeout interrupts it.
RUNAWAY_ANSWER = "The answer is \\boxed{10^{10^{10}}}."


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Natalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72", "72"),
        ("#### 1,234", "1234"),
        ("#### 1,234,567", "1234567"),
        ("#### -5", "-5"),
        ("#### 3.5", "3.5"),
        ("#### 72.", "72"),
        ("first #### 1\nthen #### 2", "2"),
        ("#### 18\nsome trailing words", "18"),
        ("#### ", None),
        ("no marker, the answer is 18", None),
        ("", None),
    ],
)
def test_ground_truth_from_gsm8k_answer(answer, expected):
    assert ground_truth_from_gsm8k_answer(answer) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3 + 4 = 7\n#### 7", "7"),
        ("So \\boxed{5} is wrong; it is 6.\n#### 6", "6"),  # #### wins over \boxed
        ("We get \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),  # nested braces kept whole
        ("Maybe \\boxed{3}, no: \\boxed{4}. Done in 2 steps.", "4"),  # last \boxed, over later numbers
        ("\\boxed{12,000} apples", "12000"),
        ("The answer is 42. I checked it 3 times.", "42"),
        ("answer: 1,000 (out of 5)", "1000"),
        ("The answer is -7, not 8.", "-7"),
        ("I counted 3, then 17.", "17"),
        ("Unclosed \\boxed{12", "12"),
        ("The total is 2.50 dollars.", "2.50"),
        ("no numbers here", None),
        ("", None),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


@pytest.mark.parametrize(
    ("response", "ground_truth"),
    [
        ("2 * 9 = <<2*9=18>>18\n#### 18", "18"),
        ("The answer is \\boxed{\\frac{1}{2}}.", "0.5"),
        ("So \\boxed{\\dfrac{3}{4}}", "0.75"),
        ("The answer is 1,234.", "1234"),
        ("#### 1,234", "1,234"),
        ("\\boxed{18 \\text{ apples}}", "18"),
        ("\\boxed{x = 18}", "18"),
        ("It costs \\boxed{\\$18}", "18"),
        ("#### 18.0", "18"),
        ("#### -5", "-5"),
    ],
)
def test_math_reward_accepts_equal_answers(response, ground_truth):
    assert math_reward(response, ground_truth) == 1.0


@pytest.mark.parametrize(
    ("response", "ground_truth"),
    [
        ("#### 19", "18"),
        ("The answer is \\boxed{\\frac{1}{3}}.", "0.5"),
        ("#### 5", "-5"),
        ("I do not know.", "18"),
        ("", "18"),
        ("\\boxed{" + "1" * (MAX_ANSWER_CHARS + 1) + "}", "1" * (MAX_ANSWER_CHARS + 1)),
    ],
)
def test_math_reward_rejects_wrong_or_missing_answers(response, ground_truth):
    assert math_reward(response, ground_truth) == 0.0


def test_gsm8k_answer_verifies_against_its_own_ground_truth():
    answer = "She had 1,000 + 234 = <<1000+234=1234>>1,234 beads.\n#### 1,234"
    ground_truth = ground_truth_from_gsm8k_answer(answer)
    assert ground_truth == "1234"
    assert math_reward(answer, ground_truth) == 1.0
    assert math_reward(answer.replace("#### 1,234", "#### 1,235"), ground_truth) == 0.0


def test_math_verify_defaults_fail_off_the_main_thread():
    """Why math_reward needs its own threading: Math-Verify's default signal timeout raises in threads."""
    errors = []

    def parse_with_defaults():
        try:
            parse("\\boxed{18}")
        except ValueError as error:
            errors.append(str(error))

    thread = threading.Thread(target=parse_with_defaults)
    thread.start()
    thread.join()
    assert errors and "threaded environment" in errors[0]


def test_math_reward_in_threads():
    cases = [("#### 18", "18", 1.0), ("\\boxed{\\frac{1}{2}}", "0.5", 1.0), ("#### 19", "18", 0.0),
             ("The answer is 1,234.", "1234", 1.0), ("no answer", "3", 0.0)] * 4
    results: dict[int, float] = {}

    def score(index: int) -> None:
        response, ground_truth, _ = cases[index]
        results[index] = math_reward(response, ground_truth)

    threads = [threading.Thread(target=score, args=(index,)) for index in range(len(cases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert results == {index: expected for index, (_, _, expected) in enumerate(cases)}

    with ThreadPoolExecutor(max_workers=3) as pool:
        assert list(pool.map(math_reward, ["#### 7", "#### 8"], ["7", "7"])) == [1.0, 0.0]


@pytest.mark.parametrize("in_thread", [False, True], ids=["main_thread", "other_thread"])
def test_runaway_answer_is_cut_off(in_thread):
    results = []
    started = time.monotonic()
    if in_thread:
        thread = threading.Thread(target=lambda: results.append(math_reward(RUNAWAY_ANSWER, "18")))
        thread.start()
        thread.join(timeout=120)
    else:
        results.append(math_reward(RUNAWAY_ANSWER, "18"))
    assert results == [0.0]
    assert time.monotonic() - started < 60
    assert math_reward("#### 18", "18") == 1.0  # still verifying after the cut-off
