"""A deterministic stand-in for a policy: answers math prompts right with a per-prompt probability.

No model runs here; what matters for the data pipeline is the *shape* of real rollouts:

* a prompt's group of ``group_size`` rollouts finishes when its longest rollout finishes, and
  rollout latency varies several-fold between prompts (``latency_s`` x 1..``LATENCY_SPREAD``,
  fixed per prompt), so prompts complete out of order;
* each prompt has its own chance of being answered right (uniform in [0, 1], fixed per
  prompt), so some groups get the same reward on every rollout (dynamic sampling drops them);
* a response states its answer GSM8K style (``#### <n>``); a wrong one is off by a few.

Everything is a pure function of ``(seed, prompt key, rollout index)``, and of ``attempt`` when one
is given: the same prompt gets the same responses in every attempt, on every worker, after every
restart.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

#: The slowest prompt's rollouts take this many times longer than the fastest's.
LATENCY_SPREAD = 6.0


def hashed_unit(*parts: object) -> float:
    """A number in [0, 1) that depends only on ``parts``."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class StandInPolicy:
    """Rollouts of one prompt (see the module doc)."""

    seed: int = 0
    group_size: int = 4
    latency_s: float = 0.01

    def correct_probability(self, key: str) -> float:
        return hashed_unit(self.seed, "p", key)

    def rollout_latency_s(self, key: str, index: int) -> float:
        """How long rollout ``index`` of prompt ``key`` takes (the prompt's scale x up to 2x)."""
        scale = 1.0 + (LATENCY_SPREAD - 1.0) * hashed_unit(self.seed, "slow", key)
        return self.latency_s * scale * (1.0 + hashed_unit(self.seed, "jitter", key, index))

    def group_latency_s(self, key: str) -> float:
        """The group finishes with its longest rollout."""
        return max(self.rollout_latency_s(key, index) for index in range(self.group_size))

    def responses(self, key: str, ground_truth: str, attempt: int = 0) -> list[str]:
        """``group_size`` responses to prompt ``key``; right ones end with ``#### <ground truth>``.
        ``attempt`` > 0 draws a new group (e.g. the epoch: a policy samples afresh every time)."""
        p = self.correct_probability(key)
        salt = (attempt,) if attempt else ()
        out = []
        for index in range(self.group_size):
            right = hashed_unit(self.seed, "right", key, index, *salt) < p
            offset = 1 + int(5 * hashed_unit(self.seed, "off", key, index, *salt))
            answer = ground_truth if right else _wrong_answer(ground_truth, offset)
            out.append(f"Let me work it out step by step (rollout {index}).\n#### {answer}")
        return out


def _wrong_answer(ground_truth: str, offset: int) -> str:
    try:
        return str(int(ground_truth) + offset)
    except ValueError:
        return f"{ground_truth} and {offset}"
