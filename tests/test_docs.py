"""The documentation site: its generated reference pages are current and it builds with warnings
as errors (a broken link, anchor, include or autodoc target is a warning, so it fails here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BUILD_TIMEOUT_S = 600


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_the_generated_reference_pages_are_current():
    result = _run(str(DOCS / "generate.py"), "--check", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # ~30 s of CPU: CI builds it (the generated pages are checked in both runs)
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    """A fresh build (-E) into a temporary folder: every page is read, so every warning shows."""
    result = _run(
        "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html", str(DOCS), str(tmp_path / "html"),
        timeout=BUILD_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, f"sphinx-build failed:\n{result.stdout}{result.stderr}"
    assert (tmp_path / "html" / "reference" / "api.html").is_file()
