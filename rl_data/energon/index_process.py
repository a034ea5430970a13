"""Energon's dataset indexing (``prepare_dataset``), run in a fresh Python process.

Energon's indexer forks its workers with the ``fork`` start method from the calling process. A
caller that has threads (a Ray driver, a process holding a tokenizer's thread pool, a test session)
can fork a child that deadlocks on a lock another thread held at the fork, and the indexer then
waits for that child forever. :func:`run_energon_prepare` therefore indexes in a new interpreter,
which has no threads when Energon forks, waits at most ``timeout_s`` and raises with the child's
output when it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

_OUTPUT_TAIL_CHARS = 4000


def run_energon_prepare(
    root: Path,
    shard_paths: Sequence[str],
    split_patterns: Sequence[tuple[str, str]],
    *,
    workers: int,
    timeout_s: float | None,
) -> None:
    """Index ``shard_paths`` (relative to ``root``) into ``root/.nv-meta`` with Energon.

    ``split_patterns`` are ``(split, regex)`` pairs, as Energon's ``split_parts_patterns``.
    Raises :class:`RuntimeError` with the indexer's output when it exits with an error, and
    :class:`TimeoutError` (the indexer killed) after ``timeout_s`` seconds.
    """
    request = {
        "root": str(root),
        "shard_paths": list(shard_paths),
        "split_patterns": [list(pair) for pair in split_patterns],
        "workers": workers,
    }
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    command = [sys.executable, "-m", __name__]
    try:
        returncode, stdout, stderr = run_in_own_group(command, json.dumps(request), env=env, timeout_s=timeout_s)
    except subprocess.TimeoutExpired as error:
        raise TimeoutError(
            f"Energon's indexing of {len(shard_paths)} shard(s) in {root} did not finish within {timeout_s} s "
            f"and was stopped; its output ended with:\n{_tail(error.stdout)}{_tail(error.stderr)}\n"
            "Raise the timeout for a large dataset, or run `energon prepare` on it to see where it stops"
        ) from None
    if returncode != 0:
        raise RuntimeError(
            f"Energon's indexing of {len(shard_paths)} shard(s) in {root} failed (exit code {returncode}); "
            f"its output ended with:\n{_tail(stdout)}{_tail(stderr)}"
        )


def run_in_own_group(
    command: Sequence[str], stdin: str, *, env: dict[str, str], timeout_s: float | None
) -> tuple[int, str, str]:
    """Run ``command`` in a new process group; return its exit code, stdout and stderr.

    On a timeout (``subprocess.TimeoutExpired``, with the output so far) or any interruption, the
    whole group is killed: the processes the command forked (Energon's indexing workers) too.
    """
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(stdin, timeout=timeout_s)
    except BaseException as error:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        if isinstance(error, subprocess.TimeoutExpired):
            raise subprocess.TimeoutExpired(command, error.timeout, stdout, stderr) from None
        raise
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # workers left behind by a failed indexing
    return process.returncode, stdout, stderr


def _tail(output: str | bytes | None) -> str:
    if not output:
        return ""
    text = output.decode(errors="replace") if isinstance(output, bytes) else output
    return text[-_OUTPUT_TAIL_CHARS:]


def _main() -> None:
    from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory

    request = json.loads(sys.stdin.read())
    BaseWebdatasetFactory.prepare_dataset(
        Path(request["root"]),
        request["shard_paths"],
        split_parts_patterns=[tuple(pair) for pair in request["split_patterns"]],
        shuffle_seed=None,
        workers=request["workers"],
    )


if __name__ == "__main__":
    _main()
