"""The README's examples, run as written: the code between ``# <marker>-start`` and ``# <marker>-end``."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distributed_fixtures import shut_down

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example(marker: str) -> str:
    """The code of the README example ``marker`` (fails the test when its markers are gone)."""
    match = re.search(rf"# {marker}-start\n(.*?)# {marker}-end", README.read_text(encoding="utf-8"), re.S)
    assert match, f"README.md lost its {marker} markers"
    return match.group(1)


@contextlib.contextmanager
def ran_readme_example(marker: str, work: Path, actor: str, namespace: str) -> Iterator[dict[str, Any]]:
    """Run example ``marker`` with ``work`` as its folder; yield its variables, then shut down the
    named actor (coordinator or feed) it started."""
    import ray

    variables: dict[str, Any] = {"work": str(work), "__name__": f"readme_{marker.replace('-', '_')}"}
    try:
        exec(compile(readme_example(marker), str(README), "exec"), variables)  # noqa: S102 - our own README
        yield variables
    finally:
        with contextlib.suppress(ValueError):  # ValueError: the example failed before it started one
            shut_down(ray, ray.get_actor(actor, namespace=namespace), actor, namespace)
