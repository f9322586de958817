"""Writes docs/benchmarks.md from the benches' reports in docs/benchmarks/ (`measure.report`).

    python tools/docs_benchmarks.py           # rewrite the page
    python tools/docs_benchmarks.py --check   # exit 1 when the page is not what the reports give

A report is a bench's own `--json`, kept as `docs/benchmarks/<bench>-<device>.json`, e.g.:

    python tools/bench_centroid.py --points 256 1024 --json docs/benchmarks/bench_centroid-cpu.json
    python tools/docs_benchmarks.py
"""

from __future__ import annotations

import argparse
import sys

from measure.report import check_page, write_page


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reports", default="docs/benchmarks", help="folder of the bench reports (*.json)")
    parser.add_argument("--out", default="docs/benchmarks.md", help="the page to write")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is stale")
    args = parser.parse_args(argv)
    try:
        if args.check:
            if not check_page(args.reports, args.out):
                sys.exit(f"{args.out} is stale: run `python tools/docs_benchmarks.py` and commit the page")
            return
        write_page(args.reports, args.out)
    except ValueError as e:
        parser.error(str(e))


if __name__ == "__main__":
    main()
