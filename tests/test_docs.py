"""README.md and docs/*.md as written: every command they show runs or composes, every relative link
leads somewhere, and the names the docs, `--help` and conf/ use agree, so the docs cannot rot.

The convention: a fenced block marked ```bash, ```sh or ```console holds commands, one a line (a
trailing backslash continues it, # starts a comment, a trailing & is dropped; in ```console only
the lines that start with "$ " are commands, the rest is their output). Any other block (```,
```yaml, ```python) is not a command. Each command's first word picks its treatment in TREATMENTS;
a command no treatment knows fails the test, so that a new kind of command is never skipped unseen.

What each treatment checks:
- `python train.py ...`: it composes and types (a -m sweep expanded as its sweeper would, with the
  sweep config's own values: the first job composes, the others' group options are checked). One that could train here (no GPU
  asked, digits or synthetic data, one run) also passes the pre-flight, and the README's train,
  tiny, through the train server; the rest (GPUs, a download, a search) only compose.
- `torchrun ... train.py ...`: torchrun's own parser takes its flags; the train.py part composes.
- `sbatch [options] script ...`: the script exists; its train.py line and the overrides compose.
- `slurm/rig.sh <sub> ...`, `scripts/postgres.sh <sub> ...`: a subcommand the script has; the rig's
  `on DIR NODE <command>` checks the command.
- `python download.py ...`: composes, and names a dataset download.py fetches.
- `python predict.py ...`, `python export.py ...`: the CLI's own parser takes the arguments (running
  them needs a trained run: tests/test_using.py runs both, and the page's Python).
- `python -m pytest paths`: the paths exist. `python -m <module> ...`: `<module> --help` runs.
- `.venv/bin/python -m tests.mutation ...`: the modules named are the ones it mutates.
- `make <target>`: a target of the Makefile. `tensorboard --logdir DIR`: TensorBoard is installed.
- `source .venv/bin/activate`, `export NAME=value ...`: the shell's; nothing to run.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import runpy
import shlex
import sys
import warnings
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from config.overrides import sweep_grid
from config.schema import Accelerator
from config.setup import CONF_DIR, ROOT, compose
from config.typed import typed
from preflight import check_and_plan
from tests import train_server
from tests.runs import FORK_RANKS
from training.profiling import WAIT, WARMUP

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = ("bash", "sh", "console")
IN_REPO_DATA = ("digits", "synthetic")  # what a run can train on here without a download


def doc_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line number, words) of each command in a text's ```bash, ```sh and ```console blocks."""
    commands = []
    for block in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        if block.group(1) not in SHELL_BLOCKS:
            continue
        first = text.count("\n", 0, block.start(2)) + 1
        line, start = "", 0
        for number, raw in enumerate(block.group(2).splitlines(), start=first):
            if block.group(1) == "console":
                if not raw.startswith("$ "):
                    continue
                raw = raw[2:]
            line, start = line + raw.rstrip(), start or number
            if line.endswith("\\"):
                line = line[:-1]
                continue
            words = shlex.split(line, comments=True)
            if words and words[-1] == "&":
                words = words[:-1]
            if words:
                commands.append((start, words))
            line, start = "", 0
    return commands


_FIRST: dict[tuple[str, ...], tuple[str, list[str]]] = {}
for _doc in DOCS:
    for _number, _words in doc_commands(_doc.read_text()):
        _FIRST.setdefault(tuple(_words), (f"{_doc.relative_to(ROOT)}:{_number}", _words))
COMMANDS = list(_FIRST.values())  # each command once, named by where it first appears (the README first)
# The README's, what a newcomer types first, also train (tiny) through the train server; the others
# that could train here stop after the pre-flight, which keeps this file within the suite's minutes.
# So do the README's W&B and MLflow runs: tests/test_loggers.py runs every backend and reads it back.
RUN_IN_FULL = {
    tuple(words)
    for _, words in doc_commands(DOCS[0].read_text())
    if not any(backend in word for word in words for backend in ("logger=wandb", "logger=mlflow"))
}


def _jobs(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The overrides of each job the command starts: a -m sweep's (or a search's) expanded as its
    sweeper reads them, the sweep config's hydra.sweeper.params first, the command line replacing
    them; an interval or a choice of a search adds no job of its own."""
    if not multirun:
        return [overrides]
    parsed = OverridesParser.create().parse_overrides(overrides)
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    params = compose(*fixed, hydra=True).hydra.sweeper.get("params") or {}
    record = OmegaConf.create({"hydra": {"sweeper": {"params": params}, "overrides": {"task": overrides}}})
    shared, swept = sweep_grid(OmegaConf.to_yaml(record))
    return [[*shared, *job] for job in itertools.product(*[values for values in swept.values() if values])]


def _check_group_options(job: list[str]) -> None:
    """Each group option the job picks is a file in conf/: what a job of a sweep differs by, checked
    without composing it again."""
    for override in OverridesParser.create().parse_overrides(job):
        group = CONF_DIR / override.key_or_group
        if "." in override.key_or_group or not group.is_dir():
            continue
        value = override.value()
        for option in value if isinstance(value, list) else [value]:
            assert option is None or (group / f"{option}.yaml").is_file(), (
                f"{override.input_line}: no {group}/{option}.yaml"
            )


def check_train_py(args: list[str], tmp_path: Path, alone: bool = True) -> None:
    """`alone`: train.py started by itself on this machine, not by torchrun, srun or make."""
    cfg_flag = "--cfg" in args
    overrides = [
        a
        for i, a in enumerate(args)
        if a not in ("-m", "--multirun", "--help", "--resolve", "--cfg") and not (cfg_flag and args[i - 1] == "--cfg")
    ]
    multirun = "-m" in args or "--multirun" in args or any(o.startswith("hparams_search=") for o in overrides)
    first, *others = _jobs(overrides, multirun)
    for job in others:  # the first job's keys, other values
        _check_group_options(job)
    cfg = compose(*first)
    settings = typed(cfg)
    if "--resolve" in args:
        OmegaConf.to_yaml(cfg, resolve=True)
    trains_here = (
        alone
        and not multirun
        and len(overrides) == len(args)
        and settings.trainer.gpus is None
        and settings.trainer.accelerator != Accelerator.gpu
        and settings.dataset.name in IN_REPO_DATA
    )
    if not trains_here:
        return
    check_and_plan(settings, tmp_path / "run")
    if ("python", "train.py", *args) in RUN_IN_FULL:
        profiled = settings.trainer.profile
        tiny = [
            "trainer.epochs=1",
            f"trainer.limit_train_batches={profiled + WAIT + WARMUP if profiled else 2}",
            "trainer.limit_val_batches=1",
            f"hydra.run.dir={tmp_path / 'run'}",
        ]
        result = train_server.run([FORK_RANKS, "trainer.progress_bar=false", *overrides, *tiny])
        assert result.returncode == 0, result.stderr[-3000:]


def check_python(words: list[str], tmp_path: Path) -> None:
    if words[1] == "train.py":
        return check_train_py(words[2:], tmp_path)
    if words[1] == "download.py":
        from data import OnDisk, serving

        assert typed(compose(*words[2:])).dataset.name in serving(OnDisk)
        return
    if words[1] in ("predict.py", "export.py"):
        return check_cli(words[1], words[2:])
    assert words[1] == "-m", f"python {words[1]}: a script test_docs.py has no treatment for"
    module, args = words[2], words[3:]
    if module == "pytest":
        paths = [arg.split("::")[0] for arg in args if arg.startswith("tests/")]  # not an option's value
        assert paths and all((ROOT / path).exists() for path in paths), args
        plugins = [args[i + 1] for i, arg in enumerate(args) if arg == "-p"]
        assert all(importlib.util.find_spec(plugin) for plugin in plugins), plugins
        return
    assert importlib.util.find_spec(module), f"no module {module}"
    saved = sys.argv
    sys.argv = [module, "--help"]
    try:
        # A module another test imported runs again as __main__, a fresh copy, as `python -m` runs it;
        # runpy warns that the imported one exists.
        with pytest.raises(SystemExit) as exit_, warnings.catch_warnings():
            warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
            runpy.run_module(module, run_name="__main__")
    finally:
        sys.argv = saved
    assert exit_.value.code in (0, None), f"python -m {module} --help exited {exit_.value.code}"


def check_cli(script: str, args: list[str]) -> None:
    cli = importlib.import_module(script.removesuffix(".py"))
    try:
        cli.parser().parse_args(args)
    except SystemExit:  # argparse printed which argument on stderr
        pytest.fail(f"`python {script} {shlex.join(args)}`: {script} refuses its arguments")


def check_torchrun(words: list[str], tmp_path: Path) -> None:
    from torch.distributed.run import get_args_parser

    try:
        args = get_args_parser().parse_args(words[1:])
    except SystemExit:  # argparse printed which flag on stderr
        pytest.fail(f"`{shlex.join(words)}`: torchrun refuses its flags")
    assert args.training_script == "train.py", words
    check_train_py(args.training_script_args, tmp_path, alone=False)


def check_sbatch(words: list[str], tmp_path: Path) -> None:
    script = next(w for w in words[1:] if not w.startswith("-"))
    assert (ROOT / script).is_file(), f"no {script}"
    line = next(line for line in (ROOT / script).read_text().splitlines() if " train.py " in line)
    own = [w for w in line.split(" train.py ", 1)[1].split() if "$" not in w and "=" in w]
    check_train_py([*own, *words[words.index(script) + 1 :]], tmp_path, alone=False)


def check_rig(words: list[str], tmp_path: Path) -> None:
    script = (ROOT / words[0]).read_text()
    cases = script.split("case $cmd in", 1)[1].split("esac", 1)[0]
    # A subcommand is a branch of the script's case, or (rig.sh's `on`) an `if` taken before it.
    subcommands = re.findall(r"^  (\w+)\)", cases, flags=re.M) + re.findall(
        r'^if \[ "\$cmd" = (\w+) \]', script, flags=re.M
    )
    assert words[1] in subcommands, f"{words[0]} has no subcommand {words[1]}"
    if words[1] == "on":
        check(words[4:], tmp_path)


def check_make(words: list[str], tmp_path: Path) -> None:
    targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M)
    assert words[1] in targets, f"the Makefile has no target {words[1]}"
    for word in words[2:]:
        assert word.startswith("ARGS="), word
        check_train_py(shlex.split(word[5:]), tmp_path, alone=False)


def check_mutation(words: list[str], tmp_path: Path) -> None:
    """`.venv/bin/python -m tests.mutation [module ...] [--max-children N] [--score]`: each module
    is one it mutates (a run takes minutes, so it does not run here)."""
    from tests.mutation import modules

    assert words[1:3] == ["-m", "tests.mutation"], f"{words[0]} runs only tests.mutation in the docs"
    args = words[3:]
    if "--max-children" in args:
        assert args[args.index("--max-children") + 1].isdigit(), args
        del args[args.index("--max-children") : args.index("--max-children") + 2]
    assert all(arg == "--score" or arg in modules() for arg in args), f"{args}: not among {modules()}"


def check_tensorboard(words: list[str], tmp_path: Path) -> None:
    assert importlib.util.find_spec("tensorboard") and words[1] == "--logdir" and len(words) == 3, words


def check_source(words: list[str], tmp_path: Path) -> None:
    assert words == ["source", ".venv/bin/activate"], words


def check_export(words: list[str], tmp_path: Path) -> None:
    assert all(re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", w) for w in words[1:]), words


TREATMENTS = {
    "python": check_python,
    "torchrun": check_torchrun,
    "sbatch": check_sbatch,
    "slurm/rig.sh": check_rig,
    "scripts/postgres.sh": check_rig,
    "make": check_make,
    ".venv/bin/python": check_mutation,
    "tensorboard": check_tensorboard,
    "source": check_source,
    "export": check_export,
}


def check(words: list[str], tmp_path: Path) -> None:
    treatment = TREATMENTS.get(words[0])
    if treatment is None:
        pytest.fail(f"`{shlex.join(words)}`: no treatment for `{words[0]}` in tests/test_docs.py's TREATMENTS")
    treatment(words, tmp_path)


@pytest.mark.parametrize("where, words", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_each_command_of_the_docs_runs_or_composes(where, words, tmp_path):
    check(words, tmp_path)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}


def test_every_relative_link_of_the_docs_leads_to_a_file_and_heading_that_exist():
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_readme_help_and_docs_name_the_same_docs():
    topics = {p.stem for p in (ROOT / "docs").glob("*.md")}
    help_yaml = (CONF_DIR / "hydra" / "help" / "train.yaml").read_text()
    listed = re.search(r"a file a topic: (.*?) \(docs/<topic>\.md\)", help_yaml, flags=re.S).group(1)
    assert set(re.split(r",\s+", listed)) == topics
    table = (ROOT / "README.md").read_text().split("## Docs", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"\]\(docs/(\w+)\.md\)", table)) == topics


def test_the_configuration_page_lists_every_group_and_option_in_conf():
    page = (ROOT / "docs" / "configuration.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*) \|$", page.split("## Groups", 1)[1].split("\n## ", 1)[0], flags=re.M))
    groups = {
        d.name: {f.stem for f in d.glob("*.yaml")} for d in CONF_DIR.iterdir() if d.is_dir() and d.name != "hydra"
    }
    assert rows.keys() == groups.keys()
    missing = {g: options - set(re.findall(r"`(\w+)`", rows[g])) for g, options in groups.items()}
    assert not any(missing.values()), missing
