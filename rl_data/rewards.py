"""Rule-based rewards for RL prompts: a response's final answer checked against the ground truth.

The ground truth is ``extra_env_info["ground_truth"]`` of an ``rl_prompt`` sample (for GSM8K
rows, :func:`ground_truth_from_gsm8k_answer` of the ``answer`` column). The response's final
answer is found by :func:`extract_final_answer` and compared with the ground truth by
Math-Verify (``math_verify.parse`` + ``math_verify.verify``), so ``0.5``, ``1/2`` and
``\\frac{1}{2}`` are the same answer.

Math-Verify bounds its work with ``signal.alarm`` (an answer like ``10^{10^{10}}`` would
otherwise compute for hours), and ``signal`` only works in a process's main thread. So in the
main thread :func:`math_reward` verifies in place (the alarm replaces any pending ``SIGALRM``
of the caller); from any other thread (threaded Ray actors, thread pools) it hands the check to
one spawned child process, where the alarm works, and restarts that child if it ever overruns
:data:`CHILD_DEADLINE_SECONDS`.
"""

from __future__ import annotations

import multiprocessing
import re
import threading
from multiprocessing.pool import Pool

from math_verify import parse, verify

GSM8K_MARKER = "####"
#: Seconds Math-Verify may spend on one parse or comparison (main thread only).
VERIFY_TIMEOUT_SECONDS = 5
#: Longer extracted answers score 0.0 without being parsed.
MAX_ANSWER_CHARS = 200
#: Off the main thread: how long one check may take in the child (its start included).
CHILD_DEADLINE_SECONDS = 60

_THOUSANDS_SEPARATOR = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_NUMBER = re.compile(r"-?\d+(?:,\d{3}(?!\d))*(?:\.\d+)?")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)", re.IGNORECASE)
_BOXED = "\\boxed{"


def ground_truth_from_gsm8k_answer(answer: str) -> str | None:
    """The value after the last ``####`` of a GSM8K answer: ``"... #### 1,234"`` -> ``"1234"``.

    Only the rest of that line counts; thousands separators and a trailing period are removed.
    None when there is no ``####`` or nothing after it.
    """
    _, marker, tail = answer.rpartition(GSM8K_MARKER)
    if not marker:
        return None
    lines = tail.strip().splitlines()
    value = _THOUSANDS_SEPARATOR.sub("", lines[0]).strip().rstrip(".").strip() if lines else ""
    return value or None


def extract_final_answer(text: str) -> str | None:
    """A response's final answer as text, or None when it states none.

    In order of precedence: the value after the last ``####`` (GSM8K), the contents of the last
    ``\\boxed{...}``, the first number after the last "answer is" / "answer:", the last number.
    """
    for found in (ground_truth_from_gsm8k_answer(text), _last_boxed(text), _after_answer_is(text)):
        if found:
            return found
    numbers = _NUMBER.findall(text)
    return _THOUSANDS_SEPARATOR.sub("", numbers[-1]) if numbers else None


def math_reward(response: str, ground_truth: str) -> float:
    """1.0 when the response's final answer equals ``ground_truth`` mathematically, else 0.0."""
    answer = extract_final_answer(response)
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return 0.0
    if threading.current_thread() is threading.main_thread():
        return _verify(ground_truth, answer)
    return _verify_in_child(ground_truth, answer)


def _verify(ground_truth: str, answer: str) -> float:
    """Math-Verify with its timeouts on: only in the main thread of a process."""
    gold = parse(_as_latex(ground_truth), parsing_timeout=VERIFY_TIMEOUT_SECONDS)
    predicted = parse(_as_latex(answer), parsing_timeout=VERIFY_TIMEOUT_SECONDS)
    return 1.0 if gold and predicted and verify(gold, predicted, timeout_seconds=VERIFY_TIMEOUT_SECONDS) else 0.0


_child_lock = threading.Lock()
_child: Pool | None = None


def _verify_in_child(ground_truth: str, answer: str) -> float:
    global _child
    with _child_lock:
        if _child is None:
            _child = multiprocessing.get_context("spawn").Pool(1)
        pool, pending = _child, _child.apply_async(_verify, (ground_truth, answer))
    try:
        return pending.get(timeout=CHILD_DEADLINE_SECONDS)
    except multiprocessing.TimeoutError:
        with _child_lock:
            if _child is pool:
                pool.terminate()
                _child = None
        return 0.0


def _as_latex(answer: str) -> str:
    """Boxed, so Math-Verify reads the whole text as one LaTeX answer (``\\dfrac``, ``\\$18``)."""
    return _BOXED + answer.strip() + "}"


def _last_boxed(text: str) -> str | None:
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, begin = 1, start + len(_BOXED)
    for index in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return _THOUSANDS_SEPARATOR.sub("", text[begin:index]).strip() or None
    return None


def _after_answer_is(text: str) -> str | None:
    matches = list(_ANSWER_IS.finditer(text))
    if not matches:
        return None
    number = _NUMBER.search(text, matches[-1].end())
    return _THOUSANDS_SEPARATOR.sub("", number.group()) if number else None
