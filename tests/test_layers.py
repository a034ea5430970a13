"""The layer order (pyproject's import-linter contracts): kept by the code, and broken by an arrow
that runs back up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=240)


def test_the_code_keeps_every_layer_contract():
    result = _lint(REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "rl_data layers, top to bottom KEPT" in result.stdout
    assert "pure cores import neither Ray nor I/O-bound layers KEPT" in result.stdout


def test_an_import_that_runs_back_up_breaks_the_contract(tmp_path):
    """A copy of the package where the bottom task registry imports the runtime: refused, named."""
    shutil.copytree(REPO / "rl_data", tmp_path / "rl_data", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    registry = tmp_path / "rl_data" / "task_registry.py"
    registry.write_text(registry.read_text() + "\nfrom rl_data.distributed import coordinator  # noqa\n")
    result = _lint(tmp_path)
    assert result.returncode == 1
    assert "rl_data layers, top to bottom BROKEN" in result.stdout
    assert "rl_data.task_registry -> rl_data.distributed.coordinator" in result.stdout
    assert "pure cores import neither Ray nor I/O-bound layers BROKEN" in result.stdout
