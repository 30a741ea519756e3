"""Does every finished run exit 0? N tiny DDP(2) runs on the CPU under each launcher, counted by exit code.

python -m bench.teardown [--runs 200] [--launchers spawn torchrun] [--jobs 1] [override ...]

A run that trained and wrote metrics.json may still die as its ranks leave (a rank's SIGABRT at
exit: docs/reliability.md); a sweep or a scheduler then counts it as failed. Each run is
`python train.py debug=ddp_cpu` (2 gloo ranks, a few batches) in a run dir of its own, started by
spawn (the default launcher) or by `torchrun --standalone --nproc-per-node=2`, the launchers taking
turns; `--jobs` runs that many at once, to load the machine as a busy node would. The overrides
are added to every run. Prints a table per launcher, then every non-zero run with its stderr's tail.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common import ROOT, table

JOB = ["debug=ddp_cpu", "trainer.progress_bar=false"]
LAUNCHERS = {
    "spawn": [sys.executable, "train.py"],
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "train.py"],
}
TAIL_LINES = 15


def one_run(launcher: str, overrides: list[str]) -> tuple[str, int, bool, str]:
    """(launcher, exit code, metrics.json written, stderr) of one run in a fresh run dir."""
    with tempfile.TemporaryDirectory(prefix="teardown-") as run_dir:
        cmd = [*LAUNCHERS[launcher], f"hydra.run.dir={run_dir}", *JOB, *overrides]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        return launcher, done.returncode, (Path(run_dir) / "metrics.json").exists(), done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="runs per launcher")
    parser.add_argument("--launchers", nargs="+", choices=list(LAUNCHERS), default=list(LAUNCHERS))
    parser.add_argument("--jobs", type=int, default=1, help="runs at once")
    parser.add_argument("overrides", nargs="*", help="added to every run, e.g. strategy=fsdp")
    args = parser.parse_args()

    order = [launcher for _ in range(args.runs) for launcher in args.launchers]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda launcher: one_run(launcher, args.overrides), order))

    rows = []
    for launcher in args.launchers:
        mine = [r for r in results if r[0] == launcher]
        codes = collections.Counter(code for _, code, _, _ in mine)
        failed = ", ".join(f"{n} x exit {code}" for code, n in sorted(codes.items()) if code != 0) or "none"
        finished = sum(written for _, _, written, _ in mine)
        rows.append([launcher, len(mine), codes[0], failed, finished])
    print(table(["launcher", "runs", "exit 0", "non-zero", "metrics.json written"], rows))
    for launcher, code, written, stderr in results:
        if code != 0:
            tail = "\n".join(stderr.strip().splitlines()[-TAIL_LINES:])
            print(
                f"\n{launcher}: exit {code}, metrics.json {'written' if written else 'missing'}; stderr's tail:\n{tail}"
            )
    if any(code != 0 for _, code, _, _ in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
