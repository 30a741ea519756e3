"""Every bad input to `python train.py`: a short message naming the key, a non-zero exit, no traceback,
and a run directory's existing checkpoints and record (.hydra/) left byte for byte as they were."""

from __future__ import annotations

import os
import pickle
import socket

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from distributed.context import make_context
from errors import ConfigError
from models.mnist_net import MnistNet
from preflight import check_and_plan
from tests.configs import typed_config
from tests.dataset_files import write_image_folder
from tests.runs import run_train
from training.checkpoint import sharded
from training.checkpoint.files import save_checkpoint

DDP = ["strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]


def _checkpoint(model, **extra) -> dict:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": None,
        "epoch": 1,
        "step": 23,
        "best": 0.5,
        "batch": 0,
        "rng": None,
        "config": "a: 1\n",
        **extra,
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A run dir that already holds checkpoints, and bad checkpoint files elsewhere."""
    root = tmp_path_factory.mktemp("bad")
    save_checkpoint(_checkpoint(MnistNet(1, 10, 8)), root / "run" / "checkpoints" / "last.pt")
    save_checkpoint(_checkpoint(MnistNet(1, 10, 8)), root / "run" / "checkpoints" / "best.pt")
    (root / "run" / ".hydra").mkdir()
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):  # the record of the run that saved them
        (root / "run" / ".hydra" / name).write_text(f"# {name} of an earlier run\n")
    good = (root / "run" / "checkpoints" / "last.pt").read_bytes()
    (root / "truncated.pt").write_bytes(good[: len(good) // 2])
    (root / "corrupt.pt").write_bytes(b"not a checkpoint" * 100)
    save_checkpoint(_checkpoint(MnistNet(1, 5, 8)), root / "other_model.pt")
    torch.save({**_checkpoint(MnistNet(1, 10, 8)), "extra": socket.socket}, root / "pickled.pt")
    (root / "a_file").write_text("")
    (root / "empty_run" / "checkpoints").mkdir(parents=True)
    _sharded(MnistNet(1, 5, 8), root / "sharded_other_model")
    _sharded(MnistNet(1, 10, 8), root / "sharded_half_written")
    (root / "sharded_half_written" / sharded.METADATA).unlink()  # DCP writes it last
    _sharded(MnistNet(1, 10, 8), root / "sharded_foreign")
    with open(root / "sharded_foreign" / sharded.METADATA, "wb") as f:
        pickle.dump(_Touch(root / "touched"), f)
    write_image_folder(root / "folders")
    return root


def _sharded(model, directory) -> None:
    """A sharded checkpoint as strategy=fsdp writes it, written by this one process."""
    directory.mkdir()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_state = {key: value for key, value in _checkpoint(model).items() if key not in ("model", "optimizer")}
    sharded.save(directory, model, optimizer, train_state, make_context(0, 0, 1, 1, "cpu", False))


class _Touch:
    """Unpickling this runs a command: reading a foreign checkpoint's metadata must not."""

    def __init__(self, path) -> None:
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def _snapshot(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# One case per way train.py can stop: (overrides, exit code, words the message must contain); {root} is
# the fixture's directory. These go through `python train.py` end to end; the rest below go through
# the same code in this process: Hydra's composition, and preflight.check_and_plan, which train.py calls.
OURS = 2  # train.py's checks: exactly one line
EXIT_PATHS = {
    "unknown model": (["model=nope"], OURS, ["model=nope: no such option in conf/model/", "mnist_net"]),
    "batch not divisible": ([*DDP[:2], "trainer.devices=3"], OURS, ["trainer.batch_size=64", "multiple of 3"]),
    "the best kept the wrong way": (  # max would keep the highest losses
        ["trainer.checkpoint.monitor=val/loss", "trainer.checkpoint.mode=max"],
        OURS,
        ["trainer.checkpoint.monitor=val/loss is better lower", "add trainer.checkpoint.mode=min"],
    ),
    "a key below a value": (["trainer.epochs.x=1"], OURS, ["trainer.epochs is a value, not a section"]),
    "Lightning's unlimited steps": (  # trained nothing, and exited 0
        ["trainer.max_steps=-1"],
        OURS,
        ["trainer.max_steps=-1", "null for no limit"],
    ),
    "Lightning's per-step EMA decay": (  # averaged nothing: the EMA was the model, evaluated twice
        ["trainer.ema_decay=0.9", "trainer.epochs=2"],
        OURS,
        ["trainer.ema_decay=0.9", "a copy of the model", "give a decay above"],
    ),
    "a warmup longer than the run": (  # trained at a fraction of optimizer.lr throughout, and exited 0
        ["scheduler.warmup_epochs=100"],
        OURS,
        ["scheduler.warmup_epochs=100", "trainer.epochs=15"],
    ),
    "a callback that does not import": (  # Hydra's own three-line ERROR log came first
        ["+callbacks.mine._target_=nowhere.Thing"],
        OURS,
        ["callbacks.mine._target_=nowhere.Thing does not import"],
    ),
    "a callback's class misspelt": (  # Hydra's "No module named ...; '...stop_at' is not a package"
        ["callbacks=stop_at", "callbacks.stop_at._target_=training.callbacks.stop_at.Stopat"],
        OURS,
        ["training.callbacks.stop_at has no Stopat; did you mean training.callbacks.stop_at.StopAt?"],
    ),
    "truncated checkpoint": (
        ["trainer.resume={root}/truncated.pt"],
        OURS,
        ["truncated.pt", "not a loadable checkpoint"],
    ),
    "a spawned rank's own check": (  # the optimizer's, in each rank; resuming the run, which stays as it was
        [*DDP, "trainer.resume=auto", "optimizer.momentum=0"],
        OURS,
        ["optimizer: torch.optim.sgd.SGD", "Nesterov"],
    ),
    "output dir not writable": (
        ["hydra.run.dir={root}/a_file/run"],
        OURS,
        ["hydra.run.dir=", "a_file/run: cannot write there (", "a_file is a file, not a folder); choose a writable"],
    ),
}
COMPOSITION = {  # Hydra's errors: the same words train.py prints (exit 1)
    "unknown dataset": (["dataset=nope"], ["dataset/nope", "digits"]),
    "unknown strategy": (["strategy=nope"], ["strategy/nope", "ddp"]),
    "unknown launcher": (["launcher=nope"], ["launcher/nope", "spawn"]),
    "wrong type": (["trainer.epochs=many"], ["trainer.epochs", "many"]),
    "unknown key": (["trainer.epoch=3"], ["trainer.epoch"]),
}
CHECKS = {  # preflight.check_and_plan's ConfigErrors: the one line train.py prints after "error: " (exit 2)
    "more GPUs than visible": (
        ["trainer.devices=2", "trainer.accelerator=gpu", "strategy=ddp"],
        ["trainer.devices=2 asks for 2 GPU(s)", "trainer.accelerator=cpu trainer.devices=2"],
    ),
    "more GPUs than visible, as trainer.gpus": (  # gpus=N also picks the GPU: the rehearsal replaces it
        ["trainer.gpus=2", "strategy=ddp"],
        ["trainer.gpus=2 asks for 2 GPU(s)", "trainer.devices=2 in place of trainer.gpus"],
    ),
    "zero epochs": (["trainer.epochs=0"], ["trainer.epochs=0"]),
    "resume path missing": (["trainer.resume={root}/nope.pt"], ["trainer.resume=", "nope.pt", "no such file"]),
    "corrupt checkpoint": (["trainer.resume={root}/corrupt.pt"], ["corrupt.pt", "not a loadable checkpoint"]),
    "checkpoint of another model": (
        ["trainer.resume={root}/other_model.pt"],
        ["other_model.pt", "fc2.weight", "[5, 128]", "[10, 128]"],
    ),
    "pickled object in checkpoint": (
        ["trainer.resume={root}/pickled.pt"],
        ["pickled.pt", "pickled Python object", "weights_only"],
    ),
    "starting over an existing run": ([], ["already holds checkpoints/last.pt", "trainer.resume=auto"]),
    "port taken": ([*DDP, "launcher.master_port={port}"], ["launcher.master_port={port}", "already in use"]),
    "a folder that holds no checkpoint": (["trainer.resume={root}"], ["a folder with no checkpoint in it", "run dir"]),
    "a run dir with no last.pt": (["trainer.resume={root}/empty_run"], ["empty_run/checkpoints/last.pt: no such file"]),
    "sharded checkpoint half written": (
        ["trainer.resume={root}/sharded_half_written"],
        ["sharded_half_written", "no .metadata"],
    ),
    "sharded checkpoint of another model": (
        ["trainer.resume={root}/sharded_other_model"],
        ["sharded_other_model", "fc2.weight", "[5, 128]"],
    ),
    "pickled object in sharded metadata": (
        ["trainer.resume={root}/sharded_foreign"],
        ["sharded_foreign", "pickled Python object", "system"],
    ),
    "fsdp with fp16": ([*DDP[1:], "strategy=fsdp", "trainer.precision=16-mixed"], ["trainer.precision=bf16-mixed"]),
    "fsdp sharding a class the model lacks": (
        ["strategy=fsdp", "strategy.shard_modules=[Bottleneck]"],
        ["strategy.shard_modules", "Bottleneck", "Conv2d"],
    ),
    "fsdp with an EMA": (
        [*DDP[1:], "strategy=fsdp", "trainer.ema_decay=0.99"],
        ["trainer.ema_decay=0.99", "strategy=ddp"],
    ),
    "fsdp sharding blocks of a model sized by its folders": (  # the classes are counted before the model is built
        [
            "dataset=imagefolder",
            "dataset.root={root}/folders",
            "model=resnet18",
            "strategy=fsdp",
            "strategy.shard_modules=[Bottleneck]",
        ],
        ["strategy.shard_modules", "Bottleneck", "BasicBlock"],
    ),
    "no batch": (["trainer.batch_size=0"], ["trainer.batch_size=0", "use 1 or more"]),
    "fewer samples than ranks": ([*DDP, "trainer.batch_size=1"], ["trainer.batch_size=1", "use 2 or more"]),
    "no training batches": (["trainer.limit_train_batches=0"], ["trainer.limit_train_batches=0", "positive"]),
    "no overfit batches": (["trainer.overfit_batches=0"], ["trainer.overfit_batches=0", "use a positive number"]),
    "an unknown compile mode": (
        ["trainer.compile=true", "trainer.compile_mode=fast"],
        ["trainer.compile_mode=fast", "reduce-overhead"],
    ),
    "a compile mode without compiling": (
        ["trainer.compile_mode=reduce-overhead"],
        ["trainer.compile_mode=reduce-overhead", "trainer.compile=true"],
    ),
    "clipping to a zero norm": (["trainer.grad_clip=0"], ["trainer.grad_clip=0", "positive max norm", "null"]),
    "an EMA never updated": (
        ["trainer.ema_decay=0.99", "trainer.ema_every_n_steps=0"],
        ["trainer.ema_every_n_steps=0", "1 or more"],
    ),
    "model built for other images": (
        ["dataset=synthetic", "model=simple_cnn", "model.image_size=28"],
        ["train images (3x32x32)", "dataset.image_size"],
    ),
    "an image size the files do not have": (
        ["dataset.image_size=16"],
        ["dataset.image_size=16", "digits images are 8x8", "set dataset.image_size=8"],
    ),
    "model that returns no logits": (
        ["dataset=synthetic", "model._target_=torch.nn.Identity"],
        ["returns (2, 3, 32, 32)", "not logits (2, 10)"],
    ),
    "fine-tuning without the weights": (
        ["experiment=cifar10_resnet18_finetune_dp"],
        ["model.weights=", "resnet18-f37072fd.pth", "no such file"],
    ),
}


@pytest.fixture
def taken_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("case", EXIT_PATHS)
def test_train_py_stops_with_one_short_error_and_touches_nothing(files, case):
    overrides, code, words = EXIT_PATHS[case]
    run_dir = files / "run"
    before = _snapshot(run_dir / "checkpoints"), _snapshot(run_dir / ".hydra")
    fill = lambda text: text.format(root=files)  # noqa: E731
    result = run_train(run_dir, *map(fill, overrides), timeout=120)
    assert result.returncode == code, result.stderr
    stderr = result.stderr.strip()
    assert "Traceback" not in stderr
    for word in map(fill, words):
        assert word in stderr, stderr
    if code == OURS:
        assert len(stderr.splitlines()) == 1 and stderr.startswith("error: "), stderr
        assert "[ERROR]" not in result.stdout, result.stdout  # the one line is all the console says of it
    assert (_snapshot(run_dir / "checkpoints"), _snapshot(run_dir / ".hydra")) == before
    assert not (files / "touched").exists()


@pytest.mark.parametrize("case", COMPOSITION)
def test_a_bad_override_fails_at_composition_naming_it(case):
    overrides, words = COMPOSITION[case]
    with pytest.raises((ConfigCompositionException, ConfigKeyError, ValidationError)) as error:
        typed_config(*overrides)
    message = str(error.value) + str(error.value.__cause__)
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("case", CHECKS)
def test_a_config_that_cannot_run_is_one_line_naming_the_key_and_touches_nothing(files, taken_port, case):
    overrides, words = CHECKS[case]
    run_dir = files / "run"
    before = _snapshot(run_dir / "checkpoints"), _snapshot(run_dir / ".hydra")
    fill = lambda text: text.format(root=files, port=taken_port)  # noqa: E731
    with pytest.raises(ConfigError) as error:
        check_and_plan(typed_config(*map(fill, overrides)), run_dir)
    message = str(error.value)
    assert "\n" not in message, message
    for word in map(fill, words):
        assert word in message, message
    assert (_snapshot(run_dir / "checkpoints"), _snapshot(run_dir / ".hydra")) == before
    assert not (files / "touched").exists()


def test_a_sharded_checkpoint_reads_from_a_path_given_as_text(files):
    """The README's way to get the whole model out of one: read_model_state(path), path a str or a Path."""
    assert set(sharded.read_model_state(str(files / "sharded_other_model"))) == set(MnistNet(1, 5, 8).state_dict())


@pytest.mark.slow
def test_a_gloo_interface_this_host_lacks_is_one_line_naming_the_variable(tmp_path, monkeypatch):
    # Each spawned rank died of gloo's "enforce fail ... Unable to find address for: nope0".
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nope0")
    result = run_train(tmp_path / "run", *DDP, "debug=fdr")
    assert result.returncode == OURS
    assert result.stderr.strip().splitlines() == [
        f"error: GLOO_SOCKET_IFNAME=nope0: {socket.gethostname()} has no such interface; unset it (every rank runs "
        f"on {socket.gethostname()}), or name one `ip -br addr` lists"
    ]
