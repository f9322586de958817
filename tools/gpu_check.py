"""One command that checks and benchmarks every CUDA path of the toolkit and writes all tables to one folder.

    python tools/gpu_check.py                          # on a CUDA machine: everything
    python tools/gpu_check.py --quick                  # smaller grids, a shorter run
    python tools/gpu_check.py --device cpu --quick     # the harness itself on CPU, as CI runs it
    python tools/gpu_check.py --part 1; python tools/gpu_check.py --part 2   # the full check in two calls
    python tools/gpu_check.py --only env tests kernels # some sections

The sections (env, tests, kernels, the benches, the training CLIs), the output folder and the summary of the targets
that each bench declares are described in `measure.gpu_check`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from measure.gpu_check import PARTS, SECTIONS, CheckError, check, env_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="smaller grids and fewer rows, for a shorter run")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default runs/gpu_check/<device>-<mode>)")
    sections = ", ".join(SECTIONS)
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=None, metavar="SECTION",
                        help=f"run only these sections, of {sections}")  # fmt: skip
    parser.add_argument("--skip", nargs="+", choices=SECTIONS, default=[], metavar="SECTION",
                        help="leave these sections out")  # fmt: skip
    half = "one half of the sections (1, then 2 into the same --out: 2 keeps 1's results)"
    parser.add_argument("--part", type=int, choices=sorted(PARTS), default=None, help=half)
    parser.add_argument("--wheels", type=Path, default=None, help="folder of wheels to install offline (default .whl)")
    # the env and kernels sections run this script again in a fresh process, with the sections' PYTHONPATH
    parser.add_argument("--child", choices=["env", "kernels"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "env":
        from attention.bench import backend_flags

        print(json.dumps({**env_report(), "point_backends": backend_flags()}))
        return 0
    if args.child == "kernels":
        if args.json is None:
            parser.error("--child kernels writes its report to --json PATH")
        from attention.bench import triton_kernels
        from measure.atomic import atomic_write_text

        atomic_write_text(args.json, json.dumps(triton_kernels(args.device, args.quick), indent=2) + "\n")
        return 0
    logging.basicConfig(level=logging.INFO, format="[gpu_check] %(message)s")
    try:
        return check(args.device, args.quick, args.out, args.only, args.skip, args.part, args.wheels)
    except CheckError as e:
        parser.error(str(e))


if __name__ == "__main__":
    sys.exit(main())
