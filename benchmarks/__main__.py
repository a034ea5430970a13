"""``python -m benchmarks [--quick] [--out DIR]``: run the suite, write JSON, Markdown and PNG."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and print where the reports are."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small workload: checks the suite runs (~2.5 min), timings not meaningful")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument(
        "--only", metavar="GLOB", default=None,
        help="run only the contenders whose name matches (e.g. '*_w2/*', '*/vlm'), no micro-benchmarks: for trying contenders",
    )  # fmt: skip
    args = parser.parse_args(argv)
    return run(quick=args.quick, out=args.out, only=args.only)


def run(*, quick: bool, out: Path, only: str | None = None) -> int:
    """Entry point shared with ``rl-data bench``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.report import write_reports
    from benchmarks.settings import BenchSettings
    from benchmarks.suite import run_suite

    settings = BenchSettings.quick() if quick else BenchSettings()
    results = run_suite(settings, out, log=lambda message: print(message, file=sys.stderr, flush=True), only=only)
    paths = write_reports(results, out)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
