"""`make mutation`: mutmut 3 over the modules setup.cfg's [mutmut] only_mutate names, against the fast
unit tests its pytest_add_cli_args_test_selection names; then each module's score, less the
equivalent mutants docs/TESTING.md lists. `python -m tests.mutation preflight.py` runs one module
(keeping the others' results); `--max-children N` caps mutmut's parallel test runs (default: one a
core); `--score` prints the score of the last runs again."""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Modules of which only a part is scored (the rest: every function of the module).
PARTS = {
    # the atomic write; a resume's decision and checks
    "training/checkpoint/files.py": ["save_checkpoint"],
    "training/checkpoint/resume.py": ["decide_resume", "_check_schedule", "open_resume"],
    "hydra_plugins/optuna_study_sweeper/_study.py": [
        "run",
        "search_space",
        "distribution",
        "_distribution",
        "override_of",
    ],
    # The pre-flight's checks, not the Plan it returns; of config/overrides.py the command line's
    # checks and the search's last override of each key (search_space's), not swept_overrides (a
    # job's record); of config/schema.py the values' checks.
    "preflight.py": [
        "check_and_plan",
        "_check_world",
        "_check_profiler",
        "_steps_at_most",
        "_check_model",
        "_check_built",
        "_check_monitors",
        "_source_of",
        "_ranks_by",
        "_check_forward",
    ],
    "config/overrides.py": [
        "check_overrides",
        "_check_no_secret",
        "_check_group_options",
        "_check_schema_keys",
        "_optional_of",
        "_is_value",
        "_check_top_level",
        "_typed_keys",
        "_unchosen_logger_options",
        "_check_free_form_keys",
        "_no_such_callback",
        "_no_such_key",
        "last_overrides",
    ],
    "config/schema.py": [
        "parse_signals",
        "check_ranges",
        "_at_least_1_or_null",
        "xǁCheckpointConfigǁ__post_init__",
        "xǁTrainerConfigǁ__post_init__",
        "xǁDataConfigǁ__post_init__",
        "xǁDatasetConfigǁ__post_init__",
        "xǁOptimizerOptionsǁ__post_init__",
        "xǁSchedulerOptionsǁ__post_init__",
    ],
}
KILLED = {1, 3, 24, -24, 36, 152, 255}  # a failing test, or a test timed out (mutmut's exit codes)


def modules() -> list[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config.get("mutmut", "only_mutate").split()


def patterns(module: str) -> list[str]:
    """mutmut's names for the module's mutants in scope: `training.checkpoint.x_save_checkpoint__mutmut_3`."""
    dotted = module.removesuffix(".py").replace("/", ".")
    return (
        [f"{dotted}.{name if name.startswith('xǁ') else 'x_' + name}__mutmut_*" for name in PARTS[module]]
        if module in PARTS
        else [f"{dotted}.*"]
    )


def equivalents() -> set[str]:
    """The mutants docs/TESTING.md lists as equivalent, one table row each: | `name` | reason |."""
    return set(re.findall(r"^\| `([\w.ǁ]+__mutmut_\d+)` \|", (ROOT / "docs/TESTING.md").read_text(), re.M))


def score() -> bool:
    """One line per module: killed / non-equivalent, then every survivor not listed as equivalent."""
    listed, met = equivalents(), True
    for module in modules():
        meta = ROOT / "mutants" / f"{module}.meta"
        codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
        scope = {
            k: v
            for k, v in codes.items()
            if any(re.fullmatch(p.replace(".", r"\.").replace("*", ".*"), k) for p in patterns(module))
        }
        equivalent = [k for k in scope if k in listed]
        counted = {k: v for k, v in scope.items() if k not in listed}
        killed = sum(v in KILLED for v in counted.values())
        share = killed / len(counted) if counted else 0.0
        met &= share >= 0.9
        print(f"{module}: {killed} / {len(counted)} killed ({share:.1%}), {len(equivalent)} equivalent")
        for name, code in sorted(counted.items()):
            if code not in KILLED:
                print(f"    {name}: {'not run' if code is None else 'survived' if code == 0 else f'exit {code}'}")
    return met


def main(argv: list[str]) -> int:
    if "--score" not in argv:
        chosen = [module for module in modules() if module in argv] or modules()
        if chosen == modules():
            shutil.rmtree(ROOT / "mutants", ignore_errors=True)  # from scratch: no result cached from other code
        names = [p for module in chosen for p in patterns(module)]
        children = ["--max-children", argv[argv.index("--max-children") + 1]] if "--max-children" in argv else []
        subprocess.run([sys.executable, "-m", "mutmut", "run", *children, *names], cwd=ROOT, check=True)
    return 0 if score() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
