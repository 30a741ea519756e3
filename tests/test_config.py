"""Config composition and the checks train.py runs before any process starts."""

from __future__ import annotations

import signal

import pytest
import yaml
from hydra._internal.hydra import Hydra
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf.errors import ConfigKeyError, ValidationError

from config import setup
from config.overrides import check_overrides, last_overrides
from config.paths import make_folder
from config.schema import (
    CheckpointConfig,
    DataConfig,
    DatasetConfig,
    LauncherConfig,
    LoggerConfig,
    StrategyConfig,
    TrainerConfig,
    parse_signals,
)
from config.setup import CONF_DIR
from errors import ConfigError
from preflight import check_and_plan
from tests.configs import compose_config, typed_config
from tests.runs import run_train


def test_default_config_composes_to_the_embedded_dataset():
    cfg = compose_config()
    assert cfg.dataset.name == "digits"
    assert cfg.strategy.name.value == "single"
    assert cfg.model.in_channels == cfg.dataset.channels == 1


def test_the_schema_is_stored_once_a_process_however_often_it_composes(monkeypatch):
    setup.register()
    stores = []
    monkeypatch.setattr(ConfigStore, "store", lambda self, **node: stores.append(node["name"]))
    for _ in range(2):
        setup.register()
        assert compose_config("model=simple_cnn").model._target_.endswith("SimpleCNN")
    assert stores == []


def test_a_typo_in_a_schema_key_fails_at_composition():
    with pytest.raises((ConfigCompositionException, ConfigKeyError)):
        compose_config("trainer.epoch=3")


def test_a_wrong_type_fails_at_composition():
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose_config("trainer.epochs=many")


@pytest.mark.parametrize(
    "override, allowed",
    [
        ("trainer.accelerator=tpu", "[auto, gpu, cpu]"),
        ("strategy.name=dpp", "[single, dp, ddp, fsdp]"),
        ("data.loader=gpu", "[dataloader, device]"),
        ("launcher.name=mpirun", "[auto, spawn, torchrun, slurm]"),
        ("trainer.nonfinite=ignore", "[stop, skip]"),
    ],
)
def test_a_closed_choice_outside_its_values_fails_at_composition_naming_them(override, allowed):
    with pytest.raises((ConfigCompositionException, ValidationError)) as error:
        compose_config(override)
    message = str(error.value) + str(error.value.__cause__)
    assert allowed in message and override.split("=")[0].split(".")[-1] in message


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["trainer.gpus=4"], ["trainer.gpus=4", "0 are visible", "trainer.accelerator=cpu trainer.devices=4"]),
        (["trainer.accelerator=gpu"], ["trainer.devices=1", "trainer.accelerator=cpu"]),
        (["trainer.accelerator=cpu", "trainer.devices=2"], ["strategy=single", "strategy=ddp"]),
        (["strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=3"], ["trainer.batch_size=64", "multiple of 3"]),
        (["trainer.epochs=0"], ["trainer.epochs=0"]),
        (["trainer.resume=/nonexistent/last.pt"], ["trainer.resume=/nonexistent/last.pt", "no such file"]),
        (["trainer.epochs=-2"], ["trainer.epochs=-2"]),
        (["trainer.checkpoint_every_n_steps=0"], ["trainer.checkpoint_every_n_steps=0", "positive"]),
        (["trainer.preempt_signals=[SIGNOPE]"], ["trainer.preempt_signals", "SIGNOPE", "SIGUSR1"]),
        (["trainer.requeue_signals=[KILL]"], ["trainer.requeue_signals", "KILL"]),
    ],
)
def test_check_names_the_key_and_the_fix(overrides, words):
    with pytest.raises(ConfigError) as error:
        check_and_plan(typed_config(*overrides))
    for word in words:
        assert word in str(error.value)


def test_gpus_shorthand_means_gpu_accelerator():
    with pytest.raises(ConfigError, match="asks for 2 GPU"):
        check_and_plan(typed_config("trainer.gpus=2", "strategy=ddp"))


def test_cpu_ddp_plan():
    plan = check_and_plan(typed_config("strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2")).launch
    assert (plan.accelerator, plan.processes_per_node, plan.process_group) == ("cpu", 2, True)
    assert set(plan.forward_signals) == {
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGUSR1,
        signal.SIGUSR2,
    }  # passed on to spawned ranks
    assert plan.requeue_signals == (signal.SIGUSR1, signal.SIGUSR2)  # parsed with them, for the ranks and train.py


def test_resume_auto_starts_fresh_but_a_plain_run_never_overwrites_last_pt(tmp_path):
    assert check_and_plan(typed_config("trainer.resume=auto"), tmp_path).launch.world_size == 1  # no last.pt yet: fresh
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.pt").write_bytes(b"a previous attempt")
    with pytest.raises(ConfigError, match="already holds checkpoints/last.pt; continue it with trainer.resume=auto"):
        check_and_plan(typed_config(), tmp_path)


def test_signal_names_may_drop_the_sig_prefix():
    assert parse_signals(["usr1", "SIGTERM"], "k") == [signal.SIGUSR1, signal.SIGTERM]


@pytest.mark.parametrize(
    "section, values, line",
    [
        (CheckpointConfig, {"save_top_k": 0}, "trainer.checkpoint.save_top_k=0: use 1 (best.pt alone) or more"),
        (TrainerConfig, {"epochs": 0}, "trainer.epochs=0: use at least 1 epoch"),
        (
            TrainerConfig,
            {"accumulate_grad_batches": 0},
            "trainer.accumulate_grad_batches=0: use 1 (no accumulation) or more",
        ),
        (TrainerConfig, {"grad_clip": -1.0}, "trainer.grad_clip=-1.0: use a positive max norm, or null for none"),
        # Lightning's "no limit" trained nothing here, and exited 0.
        (
            TrainerConfig,
            {"max_steps": -1},
            "trainer.max_steps=-1: use 1 or more optimizer steps, or null for no limit but trainer.epochs",
        ),
        (TrainerConfig, {"log_every_n_steps": 0}, "trainer.log_every_n_steps=0: use 1 or more"),
        (TrainerConfig, {"seed": -1}, "trainer.seed=-1: use 0 or more (NumPy's generators take no negative seed)"),
        (
            TrainerConfig,
            {"preempt_grace_s": 0.0},
            "trainer.preempt_grace_s=0.0: use the positive seconds from the signal to SIGKILL (SLURM's KillWait)",
        ),
        (LauncherConfig, {"timeout_s": 0.0}, "launcher.timeout_s=0.0: use a positive number of seconds"),
        (
            LauncherConfig,
            {"master_port": 65536},
            "launcher.master_port=65536: use a TCP port, 1 to 65535, or null for a free one",
        ),
        (
            LauncherConfig,
            {"master_port": 0},
            "launcher.master_port=0: use a TCP port, 1 to 65535, or null for a free one",
        ),
        (
            StrategyConfig,
            {"bucket_cap_mb": 0.0},
            "strategy.bucket_cap_mb=0.0: use a positive size in MB, or null for DDP's 25",
        ),
        # Validated on nothing, the run reported a loss of 0.
        (DatasetConfig, {"val_size": 0}, "dataset.val_size=0: use 1 or more samples"),
        (DatasetConfig, {"train_size": 0}, "dataset.train_size=0: use 1 or more samples"),
        (TrainerConfig, {"limit_val_batches": 0}, "trainer.limit_val_batches=0: use a positive number, or null"),
        (
            TrainerConfig,
            {"checkpoint_every_n_seconds": 0.0},
            "trainer.checkpoint_every_n_seconds=0.0: use a positive number of seconds, or null",
        ),
        (TrainerConfig, {"max_batch_per_device": 0}, "trainer.max_batch_per_device=0: use a positive number, or null"),
        (
            TrainerConfig,
            {"num_nodes": 0},
            "trainer.num_nodes=0: use 1 or more, or null for as many as the launcher starts",
        ),
        (
            TrainerConfig,
            {"preempt_signals": ["SIGNOPE"]},
            "trainer.preempt_signals: SIGNOPE is not a signal a process can catch; use e.g. [SIGTERM, SIGUSR1]",
        ),
        (
            TrainerConfig,
            {"requeue_signals": ["stop"]},
            "trainer.requeue_signals: stop is not a signal a process can catch; use e.g. [SIGTERM, SIGUSR1]",
        ),
        (LoggerConfig, {"sample_images": -1}, "logger.sample_images=-1: use 0 (no grid) or more images"),
        (
            DataConfig,
            {"num_workers": -1},
            "data.num_workers=-1: use 0 (load in the training process), a number of worker processes, "
            "or null (this task's CPUs shared among its ranks)",
        ),
    ],
)
def test_a_value_no_run_could_use_is_refused_as_the_config_is_typed_in_one_line_naming_the_key_and_the_fix(
    section, values, line
):
    # As OmegaConf.to_object builds each section: before the pre-flight, or anything, looks at it.
    with pytest.raises(ConfigError) as refused:
        section(**values)
    assert str(refused.value) == line


def test_a_values_least_allowed_passes_as_the_config_is_typed():
    TrainerConfig(
        checkpoint_every_n_seconds=0.5,
        num_nodes=None,
        max_batch_per_device=1,
        limit_val_batches=1,
        max_steps=1,
        log_every_n_steps=1,
        seed=0,
        preempt_grace_s=0.1,
    )
    LauncherConfig(timeout_s=0.5, master_port=65535)
    LauncherConfig(master_port=1)
    StrategyConfig(bucket_cap_mb=0.5)
    DatasetConfig(train_size=1, val_size=1)
    LoggerConfig(sample_images=0)


def test_train_py_rejects_more_gpus_than_visible_in_one_line(run_dir):
    result = run_train(run_dir, "trainer.gpus=4")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: trainer.gpus=4 asks for 4 GPU(s)"), result.stderr
    assert not (run_dir / "checkpoints").exists()


@pytest.mark.parametrize(
    "override, error",
    [
        (
            "trainer.epoch=3",
            "trainer.epoch: no such key; did you mean trainer.epochs? (python train.py --cfg job lists them all)",
        ),
        # A template's top-level seed: Hydra's five lines suggested +seed=1, which the typed config drops unread.
        (
            "seed=1",
            "seed: no such key or config group; did you mean trainer.seed? (python train.py --cfg job lists the keys, "
            "conf/ the groups)",
        ),
    ],
)
def test_train_py_rejects_an_unknown_key_in_one_line_naming_the_nearest(run_dir, override, error):
    result = run_train(run_dir, override)
    assert result.returncode == 2 and not run_dir.exists()
    assert result.stderr == f"error: {error}\n"


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "trainer.epochs=3",
            "trainer.seed=1,2",
            "model.arch=resnet50",
            "optimizer.lr=0.1",
            "hydra.run.dir=x",
            "dataset.augment.flip=true",
            "model=resnet18",
            "hydra/launcher=basic",
            "debug=fdr",
            "experiment=seed000",
            "optimized_metric=best_val_acc",
            "+note=a label",
            "++note=another",
            "+model.at_step=3",
            "+optimizer.fused=true",
            "++trainer.epochs=2",
            "~trainer.resume",
            "trainer.preempt_signals.0=SIGINT",  # an item of a list
            "-m",
            "--cfg",
            "job",
        ],
    ],
)
def test_keys_the_typed_config_has_or_does_not_type_pass_the_key_check(overrides):
    check_overrides(overrides)  # model and optimizer keys are the builder's; ~ and groups Hydra's


@pytest.mark.parametrize(
    "override, error",
    [
        ("dataset.augment.flp=true", r"^dataset.augment.flp: no such key; did you mean dataset.augment.flip\?"),
        # A typo above the leaf: the guess keeps the rest of the key.
        ("dataset.augmnt.flip=true", r"^dataset.augmnt.flip: no such key; did you mean dataset.augment.flip\?"),
        # Added with + or ++, a key the typed config lacks was kept in config.yaml and never read.
        ("+trainer.epoch=3", r"^trainer.epoch: no such key; did you mean trainer.epochs\?"),
        ("++data.num_worker=2", r"^data.num_worker: no such key; did you mean data.num_workers\?"),
        # Under an optional section (logger.wandb), below a value, below a list: Hydra's five lines,
        # or a traceback for the list's.
        ("logger.wandb.projct=x", r"^logger.wandb.projct: no such key; did you mean logger.wandb.project\?"),
        (
            "trainer.epochs.x=1",
            r"^trainer.epochs.x: no such key; trainer.epochs is a value, not a section: give trainer.epochs=\.\.\.$",
        ),
        (  # a list that is not optional
            "trainer.preempt_signals.x=1",
            r"^trainer.preempt_signals.x: no such key; trainer.preempt_signals is a list: give "
            r"trainer.preempt_signals=\[\.\.\.\], or an item, trainer.preempt_signals.0=\.\.\.$",
        ),
        (
            "dataset.mean.x=1",
            r"^dataset.mean.x: no such key; dataset.mean is a list: give dataset.mean=\[\.\.\.\], or an item, "
            r"dataset.mean.0=\.\.\.$",
        ),
    ],
)
def test_an_unknown_key_names_the_nearest_in_its_section(override, error):
    with pytest.raises(ConfigError, match=error):
        check_overrides([override])


def test_the_keys_after_an_item_of_a_list_are_checked_too():
    with pytest.raises(ConfigError, match=r"^trainer.epoch: no such key; did you mean trainer.epochs\?"):
        check_overrides(["dataset.mean.0=0.5", "trainer.epoch=3"])


@pytest.mark.parametrize(
    "overrides, error",
    [
        (
            ["trainerr.epochs=2"],
            r"^trainerr.epochs: no such key; did you mean trainer.epochs\? \(python train.py --cfg job",
        ),
        (["modle=resnet18"], r"^modle: no such key or config group; did you mean model\? "),
        (["epochs=3"], r"^epochs: no such key or config group; did you mean trainer.epochs\? "),
        (
            ["zzzzzz=1"],
            r"^zzzzzz: no such key or config group \(python train.py --cfg job lists the keys, conf/ the groups\)$",
        ),
        (
            ["hparams_search=digits", "hparams_search.n_trials=5"],
            r"^hparams_search.n_trials: no such key; hparams_search is a config group: choose one of its options with "
            r"hparams_search=<name> \(conf/hparams_search/\)$",
        ),
        (["-m", "trainer.seed=1,2", "modle=a,b"], r"^modle: no such key or config group"),  # in a sweep too
        (["zzzz.y=1"], r"^zzzz.y: no such key \(python train.py --cfg job lists them all\)$"),
        # Hydra's own node is not a group to choose: never the guess.
        (
            ["hydr=1"],
            r"^hydr: no such key or config group \(python train.py --cfg job lists the keys, conf/ the groups\)$",
        ),
        (["monitor=val/loss"], r"^monitor: no such key or config group; did you mean trainer.checkpoint.monitor\? "),
    ],
)
def test_a_key_outside_the_typed_sections_is_a_group_choice_or_one_line_naming_the_nearest(overrides, error):
    with pytest.raises(ConfigError, match=error):
        check_overrides(overrides)


@pytest.mark.parametrize(
    "overrides, error",
    [
        # Set without +, a key the node's file lacks: Hydra's five lines suggested + for what is a typo.
        (
            ["optimizer.lrr=0.1"],
            r"^optimizer.lrr: no such key; did you mean optimizer.lr\? \(python train.py --cfg job "
            r"lists them all; \+optimizer.lrr=... adds an argument of its class\)$",
        ),
        (["model=resnet18", "model.stemm=cifar"], r"^model.stemm: no such key; did you mean model.stem\?"),
        (["scheduler.warmup_epoch=1"], r"^scheduler.warmup_epoch: no such key; did you mean scheduler.warmup_epochs\?"),
        (["-m", "trainer.seed=1,2", "optimizer.lrr=0.1,0.2"], r"^optimizer.lrr: no such key"),  # in a sweep too
    ],
)
def test_a_model_optimizer_or_scheduler_key_its_file_lacks_names_the_nearest(overrides, error):
    with pytest.raises(ConfigError, match=error):
        check_overrides(overrides)


@pytest.mark.parametrize(
    "overrides, error",
    [  # Hydra's ten lines, or its traceback for null
        (
            ["trainer.epochs=2", "model=resnet"],
            "model=resnet: no such option in conf/model/; did you mean model=resnet50? choose mnist_net, resnet18, "
            "resnet50, simple_cnn, torchvision, vit_tiny",
        ),
        (["logger=[tensorboard,cvs]"], "logger=cvs: no such option in conf/logger/; did you mean logger=csv? "),
        (["-m", "model=resnet18,zzzz"], "model=zzzz: no such option in conf/model/; choose mnist_net, "),
        (
            ["callbacks=null"],
            "callbacks=null: a config group takes an option's name; choose balanced_accuracy, confusion_matrix, "
            "early_stopping, grad_norm, stop_at, or leave the group out with ~callbacks",
        ),
    ],
)
def test_a_group_choice_conf_has_no_file_for_is_one_line_with_the_options(overrides, error):
    assert _key_refusal(*overrides).startswith(error)


def test_group_choices_conf_has_pass_the_option_check():
    check_overrides(["model=resnet18", "logger=[tensorboard,csv]", "callbacks=[]", "~debug", "-m", "debug=fdr,limit"])
    check_overrides(["-m", "model=glob(*net*)"])  # a glob: Hydra's to expand
    check_overrides(["hydra/job_logging=stdout"])  # Hydra's own options, beside conf/hydra/job_logging/train.yaml
    # A config dir of the user's own may hold more options: Hydra's to find them
    check_overrides(["--config-dir", "/my/conf", "model=mine"])
    check_overrides(["-cd", "/my/conf", "model=mine"])
    check_overrides(["hydra.searchpath=[file:///my/conf]", "model=mine"])


def test_keys_an_experiment_or_group_choice_brings_pass_the_key_check():
    # An experiment picks its own model (conf/experiment/cifar10_resnet18_finetune_dp.yaml): its keys are the node's.
    check_overrides(
        ["experiment=cifar10_resnet18_finetune_dp", "model.arch=resnet18", "optimizer.lr=0.1", "scheduler.step_size=3"]
    )
    check_overrides(["model=simple_cnn,mnist_net", "model.nope=1"])  # a sweep of choices: Hydra's to judge


def _key_refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as refused:
        check_overrides(overrides)
    return str(refused.value)


def test_a_typed_key_is_refused_without_the_add_hint_and_without_a_guess_where_none_is_near():
    # + adds nothing to a typed section (the typed config drops it): no hint to add it.
    assert _key_refusal("trainer.epoch=3").endswith("(python train.py --cfg job lists them all)")
    assert _key_refusal("trainer.zzzzzz=3") == "trainer.zzzzzz: no such key (python train.py --cfg job lists them all)"


def test_every_override_is_checked_past_a_free_form_key_a_leaf_or_a_value_that_is_not_a_node():
    assert _key_refusal("optimizer.lr=0.1", "trainer.epoch=3").startswith("trainer.epoch: no such key")
    assert _key_refusal("logger.wandb.project=p", "trainer.epoch=3").startswith("trainer.epoch: no such key")
    assert _key_refusal("optimizer.lr.x=1", "optimizer.lrr=0.1").startswith("optimizer.lrr: no such key")
    assert _key_refusal("hydra.run.dir=x", "~trainer.resume", "trainer.epoch=3").startswith(
        "trainer.epoch: no such key"
    )


def test_hydras_own_keys_a_deletion_and_a_forced_add_in_a_free_form_node_are_left_to_hydra():
    check_overrides(["optimizer._partial_=true"])
    check_overrides(["callbacks=grad_norm", "callbacks.grad_norm._partial_=true"])
    check_overrides(["~trainer.nope=3", "++optimizer.fused=true"])


def test_a_model_key_its_builder_does_not_take_is_one_line():
    with pytest.raises(
        ConfigError,
        match=r"^model: models.resnet.resnet refuses these options \(got an unexpected "
        r"keyword argument 'stemm'\); fix the model.\* keys",
    ):
        check_and_plan(typed_config("model=resnet18", "+model.stemm=cifar", "trainer.accelerator=cpu"))


def test_a_validation_batch_smaller_than_the_world_is_one_line():
    with pytest.raises(
        ConfigError, match=r"^trainer.val_batch_size=1 is the global validation batch, .* use 2 or more"
    ):
        check_and_plan(
            typed_config("strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.val_batch_size=1")
        )
    check_and_plan(
        typed_config("strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.val_batch_size=2")
    )


def test_launcher_backend_picks_the_process_groups_backend(monkeypatch):
    # The ImageNet example's --dist-backend: gloo on GPUs where NCCL will not run.
    with pytest.raises(ConfigError, match="^launcher.backend=nccl takes GPUs only; on CPU use launcher.backend=gloo"):
        check_and_plan(
            typed_config("strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "launcher.backend=nccl")
        )
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    backends = {}
    for backend in ("null", "nccl", "gloo"):
        plan = check_and_plan(typed_config("strategy=ddp", "trainer.gpus=2", f"launcher.backend={backend}")).launch
        backends[backend] = plan.context(1, 1).backend
    assert backends == {"null": "nccl", "nccl": "nccl", "gloo": "gloo"}
    cpu = check_and_plan(
        typed_config("strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "launcher.backend=gloo")
    ).launch
    assert cpu.context(1, 1).backend == "gloo"


def test_sync_batchnorm_under_dp_is_refused_not_ignored():
    with pytest.raises(ConfigError, match="^strategy.sync_batchnorm=true under strategy=dp: .*use strategy=ddp"):
        check_and_plan(typed_config("strategy=dp", "strategy.sync_batchnorm=true"))


def test_a_later_override_of_a_key_replaces_an_earlier_one_whatever_its_prefix():
    # What both sweepers read as the search: hparams_search's params, then the command line.
    lines = ["Xa=0", "a=1", "b=choice(1,2)", "+c=1", "a=2", "++c=3", "b=4", "db@backup=x", "db=y", "~a"]
    kept = last_overrides(OverridesParser.create().parse_overrides(lines))
    assert [o.input_line for o in kept] == ["Xa=0", "++c=3", "b=4", "db@backup=x", "db=y", "~a"]


@pytest.mark.parametrize(
    "override, shown",
    [
        ("logger.mlflow.tracking_uri=https://me:pw-123@mlflow.example.org", "https://me:***@mlflow.example.org"),
        ("+logger.wandb.api_key=pw-123", "logger.wandb.api_key=***"),
        ("logger.wandb.api_key=[ab,pw-123]", "logger.wandb.api_key=***"),  # a list's whole value, past its comma
        ("+db.password=", "db.password=***"),
        ("hydra.sweeper.storage=postgresql://me:pw-123@db/optuna", "postgresql://me:***@db/optuna"),
    ],
)
def test_a_password_on_the_command_line_is_refused_in_one_line_that_hides_it(override, shown):
    with pytest.raises(ConfigError) as refused:
        check_overrides(["trainer.epochs=2", override])
    message = str(refused.value)
    assert shown in message and "pw-123" not in message and "give it through the environment" in message


def test_a_folder_to_write_to_is_made_or_refused_in_one_line_naming_the_key(tmp_path):
    deep = tmp_path / "a" / "b"
    make_folder(deep, "--out=x")
    assert deep.is_dir() and list(deep.iterdir()) == []  # the probe leaves nothing behind
    make_folder(deep, "--out=x")  # a folder that is there already
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ConfigError) as refused:
        make_folder(tmp_path / "a_file" / "run", "hydra.run.dir=y", fix="choose a writable hydra.run.dir")
    assert str(refused.value) == (
        f"hydra.run.dir=y: cannot write there ({tmp_path / 'a_file'} is a file, not a folder); "
        "choose a writable hydra.run.dir"
    )
    # A folder that is there but takes no file (root may write anywhere else: os.access says yes to it).
    # The reason as the system words it, not the exception's repr ([Errno 2] ...)
    with pytest.raises(ConfigError, match=r"^--png=z: cannot write there \([^\[\]]+\); give a path you can write$"):
        make_folder("/proc", "--png=z")


def test_a_start_reads_its_mode_from_the_command_line_and_composes_for_it_only_in_a_search(monkeypatch):
    """Hydra composed the whole config once more at every start only to read hydra.mode (hydra#3440)."""
    composed = []
    monkeypatch.setattr(Hydra, "get_mode", Hydra.get_mode)  # this worker's Hydra as it was, after the test
    monkeypatch.setattr(setup, "_composed_mode", lambda hydra, name, overrides: composed.append(overrides) or "read")
    setup.mode_from_the_command_line()
    hydra = object.__new__(Hydra)
    assert hydra.get_mode("config", ["hydra.mode=MULTIRUN"]) == RunMode.MULTIRUN
    assert hydra.get_mode("config", ["hydra.mode=MULTIRUN", "trainer.epochs=2", "++hydra.mode=RUN"]) == RunMode.RUN
    assert hydra.get_mode("config", ["trainer.epochs=2", "model=resnet18"]) is None  # -m, or its absence, decides
    assert hydra.get_mode("config", ["hydra.mode=SOMETIMES"]) is None  # the run's own composition refuses it
    assert composed == []
    assert hydra.get_mode("config", ["hparams_search=digits", "trainer.epochs=2"]) == "read"  # its file's
    assert composed == [["hparams_search=digits", "trainer.epochs=2"]]


def test_only_a_search_sets_hydra_mode_in_a_file_and_only_the_command_line_chooses_one():
    """train.py reads whether a start is a sweep from the command line (-m, hydra.mode=..., or
    hparams_search=..., whose file sets hydra.mode): a hydra.mode set elsewhere, or a search chosen
    by another file's defaults, would go unread (config.setup.mode_from_the_command_line)."""

    def keys(node: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
        if not isinstance(node, dict):
            return []
        return [p for key, value in node.items() for p in [(*path, str(key)), *keys(value, (*path, str(key)))]]

    setting, chosen = [], []
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        text = path.read_text()
        node = yaml.safe_load(text) or {}
        package = () if text.startswith("# @package _global_") else path.relative_to(CONF_DIR).parts[:-1]
        if any((*package, *key)[-2:] == ("hydra", "mode") for key in keys(node)):
            setting.append(path.relative_to(CONF_DIR).as_posix())
        if path != CONF_DIR / "config.yaml":  # whose defaults list it (as null) for the command line to choose
            chosen += [name for entry in node.get("defaults", []) if isinstance(entry, dict) for name in entry]
    assert setting == sorted(p.relative_to(CONF_DIR).as_posix() for p in (CONF_DIR / setup.MODE_GROUP).glob("*.yaml"))
    assert [name for name in chosen if name.endswith(setup.MODE_GROUP)] == []
