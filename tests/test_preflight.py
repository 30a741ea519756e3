"""The pre-flight check, each refusal by the key it names and the fix: a resume against the run dir
and the checkpoint, the recipe keys' ranges (both ends), the trainer keys' least values, the forward
on the meta device (a model whose modes differ, one that reads a tensor's value, one that returns
more than logits), the loss and callbacks built, the profiler and logger keys (test_config.py and
test_recipes.py hold the other checks; docs/TESTING.md the mutants these were written against)."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from config.overrides import check_overrides
from config.schema import COMPILE_MODES, ResumePoint, TrainerConfig
from errors import ConfigError
from models.mnist_net import MnistNet
from preflight import _check_forward, _check_model, _check_monitors, _check_world
from preflight import check_and_plan as check
from tests.configs import typed_config
from training.checkpoint import resume
from training.checkpoint.files import save_checkpoint


def _last_pt(run_dir: Path, scheduler_config: dict | None = None) -> Path:
    """A train.py checkpoint of the default model, without a warmup, as a run dir's last.pt."""
    path = run_dir / "checkpoints" / "last.pt"
    config = yaml.safe_dump({"scheduler": scheduler_config}) if scheduler_config else None
    save_checkpoint(
        {
            "model": MnistNet(1, 10, 8).state_dict(),
            "optimizer": {},
            "scheduler": None,
            "epoch": 1,
            "step": 3,
            "best": 0.5,
            "config": config,
        },
        path,
    )
    return path


def _refusal(*overrides: str, run_dir: Path | None = None) -> str:
    """The one line that refuses `python train.py *overrides`: as the config is typed, or in the check."""
    with pytest.raises(ConfigError) as refused:
        check(typed_config(*overrides), run_dir)
    return str(refused.value)


def _refusal_of(cfg, run_dir: Path | None = None) -> str:
    with pytest.raises(ConfigError) as refused:
        check(cfg, run_dir)
    return str(refused.value)


def test_resume_auto_continues_the_run_dirs_last_pt_and_without_a_run_dir_starts_fresh(tmp_path, monkeypatch):
    path = _last_pt(tmp_path)
    monkeypatch.setattr(resume, "_opened", {})
    plan = check(typed_config("trainer.resume=auto"), tmp_path)
    assert plan.launch.in_process and plan.resume == ResumePoint(path, 3, path.stat().st_size)
    assert resume._opened[path][0] == plan.resume  # a run that trains in this process restores from this read
    assert check(typed_config("trainer.resume=auto")).resume is None  # no run dir yet (a -m job's parent)


def test_a_plain_run_over_a_run_dirs_last_pt_is_refused_in_one_line(tmp_path):
    _last_pt(tmp_path)
    assert _refusal(run_dir=tmp_path) == (
        f"hydra.run.dir={tmp_path} already holds checkpoints/last.pt; continue it with trainer.resume=auto or "
        "train in another hydra.run.dir"
    )


def test_a_checkpoint_trained_without_a_warmup_refuses_one_in_one_line(tmp_path):
    path = _last_pt(tmp_path)
    assert _refusal(f"trainer.resume={path}", "scheduler.warmup_epochs=1") == (
        f"trainer.resume={path} trained without a warmup and cannot continue with one; resume with the "
        "scheduler.warmup_epochs it trained with"
    )


def test_a_scheduler_key_the_checkpoint_lacks_is_named_as_none(tmp_path):
    trained = {
        "_target_": "torch.optim.lr_scheduler.StepLR",
        "step_size": 7,
        "warmup_epochs": 0,
        "warmup_start_factor": 0.01,
    }  # no gamma
    path = _last_pt(tmp_path, trained)
    assert _refusal(f"trainer.resume={path}", "scheduler=step") == (
        f"trainer.resume={path} trained with scheduler.gamma=none, and this run asks for 0.1: a resume continues "
        "the saved schedule; resume with the scheduler it trained with or train afresh in a new run dir"
    )


# A recipe key outside its range (refused as the config is typed, before any model is built), and
# the whole line that refuses it.
RANGES = [
    ("trainer", "label_smoothing", 1.0, "0 (off) up to below 1"),
    ("dataset", "random_erase", 1.5, "a probability, 0 (off) to 1"),
    ("trainer", "mixup_alpha", -0.1, "0 (off) or a Beta(alpha, alpha)"),
    ("trainer", "cutmix_alpha", -1.0, "0 (off) or a Beta(alpha, alpha)"),
    ("trainer", "ema_decay", 0.0, "a decay in (0, 1), e.g. 0.99998, or null"),
    ("trainer", "ema_decay", 1.0, "a decay in (0, 1), e.g. 0.99998, or null"),
    ("trainer", "ema_every_n_steps", 0, "1 or more"),
    ("scheduler", "warmup_epochs", -1, "0 (off) or more"),
    ("scheduler", "warmup_start_factor", 0.0, "a fraction of the lr in (0, 1]"),
    ("scheduler", "warmup_start_factor", 1.5, "a fraction of the lr in (0, 1]"),
    ("optimizer", "reference_batch", 0, "the batch lr was tuned for"),
    ("optimizer", "norm_weight_decay", -0.1, "null (as weight_decay) or 0 and up"),
    ("data", "repeated_augmentations", 0, "1 (off) or more"),
]


@pytest.fixture(scope="module")
def composed():
    return typed_config()


@pytest.mark.parametrize("section, key, value, allowed", RANGES)
def test_a_recipe_key_out_of_its_range_is_one_line_naming_what_it_takes(section, key, value, allowed):
    assert _refusal(f"{section}.{key}={value}") == f"{section}.{key}={value}: use {allowed}"


def test_a_warmup_may_start_at_the_full_lr():
    check(typed_config("scheduler.warmup_start_factor=1.0"))


@pytest.mark.parametrize(
    "section, key, value",
    [  # each range's closed end, and a value inside it
        ("dataset", "random_erase", 1.0),
        ("optimizer", "reference_batch", 1),
        ("optimizer", "norm_weight_decay", 0.0),
        ("optimizer", "norm_weight_decay", 0.5),
    ],
)
def test_a_recipe_key_at_the_end_of_its_range_passes(section, key, value):
    typed_config(
        f"{section}.{key}={value}"
    )  # the range alone (digits refuses random_erase: its images are ready tensors)


def test_linear_lr_scaling_needs_optimizer_lr_and_only_it_does():
    typed_config("optimizer.lr_scaling=linear")
    refusal = _refusal("optimizer.lr_scaling=linear", "~optimizer.lr")
    assert refusal.startswith("optimizer.lr_scaling=linear scales optimizer.lr, which is not set")
    check(typed_config("~optimizer.lr"))  # the optimizer's own default lr


def test_a_warmup_as_long_as_the_run_is_refused_and_one_epoch_shorter_passes():
    assert _refusal("trainer.epochs=3", "scheduler.warmup_epochs=3") == (
        "scheduler.warmup_epochs=3 leaves no epoch at the lr it warms up to (trainer.epochs=3); give fewer warmup "
        "epochs, or more trainer.epochs"
    )
    typed_config("trainer.epochs=3", "scheduler.warmup_epochs=2")
    # A debug preset's short run of a recipe with a warmup (tv_resnet50: 5 epochs) leaves the warmup out
    assert typed_config("experiment=tv_resnet50", "debug=fdr").scheduler["warmup_epochs"] == 0
    assert typed_config("debug=limit", "scheduler.warmup_epochs=1").scheduler["warmup_epochs"] == 1


def test_the_model_modules_own_check_runs_before_launch():
    assert _refusal("model=resnet18", "model.stem=nope").startswith("model.stem=nope: no such stem")


@pytest.mark.parametrize("steps, profile, fix", [(6, 1, None), (5, 1, "train 6 or more steps")])
def test_trainer_profile_fits_the_steps_after_the_profilers_warm_up(composed, steps, profile, fix):
    cfg = copy.deepcopy(composed)
    cfg.trainer.max_steps, cfg.trainer.profile = steps, profile
    if fix is None:
        check(cfg)
    else:
        assert _refusal_of(cfg).endswith(fix)


def test_a_test_only_run_without_weights_names_the_ways_to_give_them():
    assert _refusal("trainer.test_only=true").endswith(
        "give trainer.resume=<checkpoint>, trainer.init_from=<run dir> or model.weights=<file>"
    )


def test_trainer_profile_passes_where_no_key_bounds_the_runs_steps(composed):
    cfg = copy.deepcopy(composed)
    cfg.trainer.profile = 2
    check(cfg)


def test_logger_options_pass_where_every_job_of_a_sweep_chooses_that_logger_or_none_is_set():
    check_overrides(["-m", "logger=wandb,[wandb,csv]", "logger.wandb.project=p"])
    check_overrides(["logger.wandb=null"])  # the node itself, not an option of it


def test_a_test_only_run_of_model_weights_passes_and_the_forward_check_builds_without_them(tmp_path, recwarn):
    from models.resnet import resnet

    weights = tmp_path / "trained.pth"
    torch.save(resnet("resnet18", 1, 10, "cifar").state_dict(), weights)
    check(typed_config("model=resnet18", "model.stem=cifar", f"model.weights={weights}", "trainer.test_only=true"))
    assert not [w for w in recwarn if "meta parameter" in str(w.message)]  # one per tensor, loading on meta


class FlattensInTraining(torch.nn.Module):
    """A model whose modes differ: training flattens the image (sized for 8 px), evaluation pools it."""

    def __init__(self):
        super().__init__()
        self.flat, self.pooled = torch.nn.Linear(64, 10), torch.nn.Linear(1, 10)

    def forward(self, x):
        return self.flat(x.flatten(1)) if self.training else self.pooled(x.mean((2, 3)))


class ReturnsAuxInTraining(FlattensInTraining):
    """GoogLeNet's way: training returns the logits and an auxiliary head's."""

    def forward(self, x):
        return (self.pooled(x.mean((2, 3))),) * 2 if self.training else self.pooled(x.mean((2, 3)))


class ReadsAValueInForward(FlattensInTraining):
    def forward(self, x):
        return self.pooled(x.mean((2, 3))) * float(x.sum())


def reads_a_value():
    """A builder that reads a tensor's value, as RegNet's does: the meta device cannot tell."""
    return torch.nn.Linear(int(torch.ones(()).item()), 10)


def _sized(composed, model, train_crop, val_crop):
    cfg = copy.deepcopy(composed)
    cfg.model, cfg.dataset.train_crop, cfg.dataset.val_crop = model, train_crop, val_crop
    return cfg, 10


def test_the_forward_check_runs_the_train_size_in_training_mode_and_the_val_size_in_evaluation(composed):
    model = {"_target_": f"{__name__}.FlattensInTraining"}
    _check_forward(*_sized(composed, model, 8, 16))
    with pytest.raises(ConfigError, match=r"^the model cannot take dataset=digits's train images \(1x16x16\)"):
        _check_forward(*_sized(composed, model, 16, 8))
    refusal = str(pytest.raises(ConfigError, _check_forward, *_sized(composed, composed.model, None, 16)).value)
    assert refusal.startswith("the model cannot take dataset=digits's val images (1x16x16): ")
    # The layer and the shapes, then torch's own line: the features it got, and those it takes.
    assert "layer fc1 (Linear(in_features=256, out_features=128, bias=True)) got input (2, 2304): " in refusal
    assert "[2, 2304] X [256, 128]" in refusal
    assert refusal.endswith(
        "; build the model for these images, or set dataset.image_size (or train_crop / val_crop) to the size it "
        "is built for"
    )


def test_a_builder_that_reads_a_tensors_value_is_left_to_the_first_step(composed):
    _check_forward(*_sized(composed, {"_target_": f"{__name__}.reads_a_value"}, None, None))


def test_a_model_that_returns_more_than_logits_is_one_line_naming_what_it_returns(composed):
    cfg = _sized(composed, {"_target_": f"{__name__}.ReturnsAuxInTraining"}, None, None)
    refusal = str(pytest.raises(ConfigError, _check_forward, *cfg).value)
    assert refusal.startswith("the model returns tuple for a batch of 2, not logits (2, 10)")
    assert refusal.endswith("; build it to return one row of class scores per image")


def test_a_forward_that_reads_a_tensors_value_is_left_to_the_first_step(composed):
    _check_forward(*_sized(composed, {"_target_": f"{__name__}.ReadsAValueInForward"}, None, None))


@pytest.mark.parametrize("key", ["model", "loss", "callbacks.grad_norm"])
def test_a_model_loss_or_callback_without_a_target_is_one_line_naming_the_group_to_copy(key):
    refusal = _refusal("callbacks=grad_norm", f"~{key}._target_")
    group = key.split(".")[0]
    assert refusal.startswith(f"{key}: no _target_") and refusal.endswith(f"as the files in conf/{group}/ do")


@pytest.mark.parametrize("key", ["model", "loss", "callbacks.grad_norm"])
def test_a_model_loss_or_callback_that_does_not_import_is_one_line_naming_the_key(key):
    refusal = _refusal("callbacks=grad_norm", f"{key}._target_=models.nowhere.Net")
    assert refusal.startswith(f"{key}._target_=models.nowhere.Net does not import (ModuleNotFoundError: ")
    assert refusal.endswith(
        "name a class importable from this repo, as the files in conf/" + key.split(".")[0] + "/ do"
    )


@pytest.mark.parametrize(
    "target, refusal",
    [  # the module imports: the name is what is wrong, not a module or a package as Hydra says
        ("models.mnist_net.Mnistnet", "models.mnist_net has no Mnistnet; did you mean models.mnist_net.MnistNet?"),
        ("training.loss.Focal", "training.loss has no Focal; did you mean training.loss.FocalLoss?"),
        ("training.loss.Zzzzzz", "training.loss has no Zzzzzz; name one that training.loss defines"),
    ],
)
def test_a_target_whose_module_lacks_the_name_says_so_and_the_nearest_name(target, refusal):
    key = "model" if target.startswith("models.") else "loss"
    assert _refusal(f"{key}._target_={target}") == f"{key}._target_={target}: {refusal}"


def test_a_callbacks_file_written_flat_as_a_loss_is_one_line_saying_where_its_target_goes():
    # conf/loss/ and conf/model/ files are flat; a callback's sits under its name: `callbacks._target_`
    # read as a callback named _target_, "callbacks._target_: no _target_".
    refusal = _refusal("+callbacks._target_=training.callbacks.stop_at.StopAt", "+callbacks.value=0.9")
    assert refusal == (
        "callbacks._target_=training.callbacks.stop_at.StopAt: a callback's file in conf/callbacks/ puts its "
        "_target_ and options under the callback's name (`<name>:`, then `  _target_: ...`), as the files there do"
    )


def test_the_trainer_keys_least_values_pass():
    # a sample per process, a norm below 1
    least = ["trainer.epochs=1", "trainer.batch_size=1", "trainer.grad_clip=0.5", "trainer.overfit_batches=1"]
    ones = ["trainer.limit_train_batches=1", "trainer.limit_val_batches=1", "trainer.checkpoint_every_n_steps=1"]
    check(typed_config(*least, *ones))


def test_a_bad_signal_names_its_key():
    assert _refusal("trainer.preempt_signals=[SIGNOPE]").startswith("trainer.preempt_signals")
    assert _refusal("trainer.requeue_signals=[SIGNOPE]").startswith("trainer.requeue_signals")


def test_only_a_multirun_job_on_a_gpu_runs_in_a_process_of_its_own(monkeypatch):
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    cfg = typed_config("trainer.gpus=1")
    assert not check(cfg).launch.own_process and check(cfg, multirun=True).launch.own_process


def test_fp16_on_cpu_and_an_unknown_compile_mode_name_their_fixes():
    refusal = _refusal("trainer.accelerator=cpu", "trainer.precision=16-mixed")
    assert refusal.startswith("trainer.precision=16-mixed needs CUDA")
    assert refusal.endswith("on CPU use trainer.precision=bf16-mixed or 32")
    assert _refusal("trainer.compile_mode=fast") == f"trainer.compile_mode=fast: choose {', '.join(COMPILE_MODES)}"


ELASTIC = "every world size torchrun may re-form the job at (--nnodes=MIN:MAX x --nproc-per-node)"


@pytest.mark.parametrize("num_nodes", [1, None])
def test_a_batch_the_world_cannot_split_names_the_fix_and_in_an_elastic_world_every_size(num_nodes):
    world = SimpleNamespace(world_size=4, accelerator="cpu")

    def refusal(**settings) -> str:
        with pytest.raises(ConfigError) as refused:
            _check_world(TrainerConfig(num_nodes=num_nodes, **settings), world)
        return str(refused.value)

    elastic = num_nodes is None
    assert refusal(batch_size=2) == (
        "trainer.batch_size=2 is the global batch, at least one sample for each of 4 process(es); use 4 or more"
        + (f", and with trainer.num_nodes=null, as many as the largest of {ELASTIC}" if elastic else "")
    )
    assert refusal(batch_size=6) == (
        "trainer.batch_size=6 is the global batch and must split evenly over 4 processes; use a multiple of 4"
        + (f", and with trainer.num_nodes=null, of {ELASTIC}" if elastic else "")
    )
    assert refusal(batch_size=8, val_batch_size=2) == (
        "trainer.val_batch_size=2 is the global validation batch, at least one sample for each of 4 process(es); "
        "use 4 or more, or null for trainer.batch_size"
    )


def test_a_monitor_with_no_near_figure_lists_the_figures_without_a_guess():
    with pytest.raises(ConfigError) as refused:
        _check_monitors(typed_config("trainer.checkpoint.monitor=zzzz"), {})
    assert str(refused.value).startswith(
        "trainer.checkpoint.monitor=zzzz: this run produces no such figure at validation's end; it produces val/"
    )


def test_a_models_check_gets_the_builders_default_for_a_key_the_config_leaves_out():
    node = {k: v for k, v in typed_config("model=vit_tiny").model.items() if k != "patch_size"}
    _check_model(node)  # TinyViT's default patch, 4, tiles the digits' 8 px
    with pytest.raises(ConfigError, match=r"^model.patch_size=4 must tile dataset.image_size=10"):
        _check_model({**node, "image_size": 10})
