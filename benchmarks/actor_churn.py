"""``python -m benchmarks.actor_churn [--actors 1000] [--every 25] [--out DIR]``: what does a replaced actor cost the process that replaced it?

A coordinator or feed replaces a dead rank with a new actor and keeps running for days, so whatever
its process keeps per actor it started adds up. Bare Ray, no rl_data: one owner actor per way of
replacing, each ``--actors`` times in turn (start or restart, one call, ``ray.kill``, the error of a
call in flight), sampling the owner's anonymous memory (``rss - shared``) every ``--every``:

* ``new_actor``: a new named actor each time, from one Ray class (what ``RankPool`` does);
* ``class_per_actor``: the same, each from its own ``ray.remote(cls)`` call (a new Ray class each);
* ``ray_restart``: one actor with ``max_restarts=-1``, killed with ``no_restart=False`` and restarted by Ray.

Prints each way's growth in KB per replacement (Theil-Sen slope over the second half) and its ratio to
``new_actor``. Writes ``actor_churn.json`` and ``actor_churn.md`` to ``--out``. Starts a private local Ray.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.soak import second_half_slope

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "actor_churn"
WAYS = ("new_actor", "class_per_actor", "ray_restart")
TIMEOUT_S = 120.0


class Replaced:
    """The replaced actor: answers calls with its pid."""

    def ping(self, payload: bytes = b"") -> int:
        return os.getpid()


class Owner:
    """Replaces an actor ``count`` times one way, then reports its own anonymous memory in MB."""

    def __init__(self, way: str) -> None:
        import ray

        self.way, self.started = way, 0
        self.remote_class = ray.remote(num_cpus=0)(Replaced)
        self.restarted = self.remote_class.options(max_restarts=-1).remote() if way == "ray_restart" else None

    def replace(self, count: int) -> float:
        import psutil
        import ray
        from ray.exceptions import RayActorError

        for _ in range(count):
            if self.restarted is not None:
                actor = self.restarted
            else:
                remote_class = ray.remote(num_cpus=0)(Replaced) if self.way == "class_per_actor" else self.remote_class
                actor = remote_class.options(name=f"{self.way}{self.started}").remote()
            for attempt in itertools.count():  # a restarting actor refuses calls until it is back
                try:
                    ray.get(actor.ping.remote(b"x" * 5000), timeout=TIMEOUT_S)
                    break
                except RayActorError:
                    if attempt >= 200:
                        raise
                    time.sleep(0.05)
            in_flight = actor.ping.remote()
            ray.kill(actor, no_restart=self.restarted is None)
            try:
                ray.get(in_flight, timeout=TIMEOUT_S)
            except RayActorError:
                pass
            del actor, in_flight
            self.started += 1
        info = psutil.Process().memory_full_info()
        return (info.rss - info.shared) / 2**20


def kb_per_replacement(points: list[tuple[int, float]]) -> float:
    """The soak's Theil-Sen slope of (replacements, MB) over the second half, in KB per replacement."""
    per_1000 = second_half_slope([count for count, _ in points], [mb for _, mb in points])
    return 1024 * per_1000 / 1000


def run(actors: int, every: int, log: Any = print) -> dict[str, Any]:
    """Each way in turn in one private local Ray; its samples and KB per replacement."""
    import ray

    ray.init(address="local", include_dashboard=False, num_cpus=2, log_to_driver=False)
    try:
        owner_class = ray.remote(num_cpus=0)(Owner)
        results: dict[str, Any] = {}
        for way in WAYS:
            owner = owner_class.remote(way)
            points = [(0, ray.get(owner.replace.remote(0), timeout=TIMEOUT_S))]
            started = time.perf_counter()
            while points[-1][0] < actors:
                count = min(every, actors - points[-1][0])
                points.append((points[-1][0] + count, ray.get(owner.replace.remote(count), timeout=TIMEOUT_S * count)))
                log(f"{way}: {points[-1][0]} replacements, owner {points[-1][1]:.1f} MB")
            ray.kill(owner)
            results[way] = {"points": points, "seconds": time.perf_counter() - started, "kb_per_replacement": kb_per_replacement(points)}
        return results
    finally:
        ray.shutdown()


def markdown(results: dict[str, Any]) -> str:
    base = results["new_actor"]["kb_per_replacement"]
    lines = ["| way | replacements | owner MB: start -> end | KB per replacement (2nd half) | vs new_actor | seconds |", "|---|---|---|---|---|---|"]
    for way, r in results.items():
        (_, first), (count, last) = r["points"][0], r["points"][-1]
        ratio = f"{r['kb_per_replacement'] / base:.2f}x" if base > 0 else "n/a"
        lines.append(f"| {way} | {count} | {first:.1f} -> {last:.1f} | {r['kb_per_replacement']:.1f} | {ratio} | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=1000, help="replacements per way")
    parser.add_argument("--every", type=int, default=25, help="replacements between two samples")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    args = parser.parse_args(argv)
    if args.actors < 2 * args.every or args.every < 1:
        parser.error(f"--actors={args.actors} must be at least 2 x --every={args.every} (>= 1): the slope needs 2 samples")
    results = run(args.actors, args.every, log=lambda line: print(line, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "actor_churn.json").write_text(json.dumps(results, indent=1))
    table = markdown(results)
    (args.out / "actor_churn.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
