"""The recipe knobs' math, each against a hand computation: warmup, lr scaling, weight-decay
groups, label smoothing, MixUp/CutMix, EMA, top-5, repeated augmentation, torchvision models."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from config.schema import LrScaling, OptimizerOptions, SchedulerOptions, TrainerConfig
from config.typed import factory, model_factory, scaled_lr, target_arguments
from data import Loaders
from data.sampler import RepeatedAugmentationSampler
from data.transforms import sample_transform
from distributed.context import make_context
from errors import ConfigError
from models.zoo import check as check_torchvision
from models.zoo import torchvision_classifier
from preflight import check_and_plan
from tests.configs import compose_config, job_config, typed_config
from tests.dataset_files import write_image_folder
from tests.test_train_step import _trainer
from training.ema import EMA
from training.loss import CrossEntropy
from training.metrics import Accumulator
from training.mixing import Mixing
from training.optimizer import check_arguments, parameter_groups
from training.scheduler import Warmup, with_warmup


def _sgd(lr: float = 1.0) -> torch.optim.SGD:
    return torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=lr)


def test_warmup_rises_linearly_every_step_then_hands_over_to_the_epoch_scheduler():
    optimizer = _sgd()
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=2)
    warmup = Warmup(optimizer, cosine, start_factor=0.01, epochs=1, steps=4)  # 1 epoch of 4 steps
    lrs = [optimizer.param_groups[0]["lr"]]
    for step in range(1, 5):
        warmup.step_update(step)
        lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs == pytest.approx([0.01, 0.2575, 0.505, 0.7525, 1.0])
    optimizer.step()  # (torch warns about a scheduler stepped before its optimizer)
    warmup.step()  # end of the warmup epoch: cosine starts at its beginning
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1.0)
    warmup.step_update(6)
    warmup.step()  # the first cosine epoch ends: cos(pi / 2)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5)
    resumed_optimizer = _sgd()
    resumed_optimizer.load_state_dict(optimizer.state_dict())
    resumed = Warmup(
        resumed_optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(resumed_optimizer, T_max=2), 0.01, 1, 4
    )
    resumed.load_state_dict(warmup.state_dict())
    resumed.step()
    warmup.step()
    assert resumed_optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)


def test_warmup_in_front_of_steplr_hands_over_at_the_warmups_end():
    optimizer = _sgd()
    step_lr = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.1)
    warmup = Warmup(optimizer, step_lr, start_factor=0.01, epochs=1, steps=2)  # 1 epoch of 2 steps
    lrs, step = [], 0
    for _ in range(6):  # as the Trainer drives it: step_update after every step, step() at each epoch's end
        for _ in range(2):
            lrs.append(optimizer.param_groups[0]["lr"])  # the lr this step trains with
            optimizer.step()
            step += 1
            warmup.step_update(step)
        warmup.step()
    warm = [0.01, 0.01 + (1 - 0.01) * 1 / 2]  # linear from 0.01 over the 2 warmup steps
    # then StepLR from its own epoch 0: lr 1 for step_size=2 epochs, x0.1 every 2 epochs after
    assert lrs == pytest.approx(warm + [1.0] * 4 + [0.1] * 4 + [0.01] * 2)


def test_warmup_without_an_epoch_scheduler_ends_at_the_lr():
    optimizer = _sgd(0.4)
    warmup = Warmup(optimizer, None, start_factor=0.5, epochs=2, steps=2)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.2)
    warmup.step_update(1)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.3)
    for _ in range(3):
        warmup.step_update(2)
        warmup.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.4)


def test_warmup_counts_optimizer_steps_not_micro_batches():
    # 7 micro-batches in groups of 2 are 4 optimizer steps an epoch, the last group holding one.
    warmup = with_warmup(_sgd(), None, SchedulerOptions(warmup_epochs=2), TrainerConfig(accumulate_grad_batches=2), 7)
    assert warmup.steps == 2 * 4


def test_linear_lr_scaling_multiplies_by_the_samples_per_step_over_the_reference_batch():
    trainer = TrainerConfig(batch_size=256, accumulate_grad_batches=2)
    assert scaled_lr(0.5, OptimizerOptions(LrScaling.linear, reference_batch=1024), trainer) == pytest.approx(0.25)
    assert scaled_lr(0.5, OptimizerOptions(LrScaling.none, reference_batch=1024), trainer) == 0.5


@pytest.mark.parametrize(
    "overrides, words",
    [
        ([], []),  # the defaults pass
        (
            ["optimizer.momentum=0"],
            [
                "optimizer: torch.optim.sgd.SGD refuses",
                "momentum=0",
                "Nesterov momentum requires a momentum",
                "optimizer.*",
            ],
        ),
        (["optimizer=adamw", "+optimizer.lrr=0.1"], ["optimizer: torch.optim.adamw.AdamW", "'lrr'"]),
        (
            ["scheduler=step", "+scheduler.T_max=3"],
            ["scheduler: torch.optim.lr_scheduler.StepLR", "'T_max'", "scheduler.*"],
        ),
        (
            ["scheduler=step", "scheduler.step_size=0"],  # torch's own message names no key
            ["scheduler: torch.optim.lr_scheduler.StepLR refuses", "step_size=0", "by zero", "scheduler.*"],
        ),
    ],
)
def test_the_optimizers_and_schedulers_own_checks_are_one_line_naming_the_keys(overrides, words):
    cfg = typed_config(*overrides)
    optimizer = factory(target_arguments(cfg.optimizer, OptimizerOptions))
    scheduler = factory(target_arguments(cfg.scheduler, SchedulerOptions))
    if not words:
        check_arguments(optimizer, scheduler)
        return
    with pytest.raises(ConfigError) as error:
        check_arguments(optimizer, scheduler)
    assert "\n" not in str(error.value)
    for word in words:
        assert word in str(error.value), error.value


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_optimizer_fused_reaches_the_optimizer(optimizer):
    for value, fused in (("true", True), ("null", None)):
        cfg = typed_config(f"optimizer={optimizer}", f"optimizer.fused={value}")
        build = factory(target_arguments(cfg.optimizer, OptimizerOptions))
        assert build([nn.Parameter(torch.zeros(1))]).defaults["fused"] is fused


def test_norm_weight_decay_takes_normalisation_layers_and_biases_out_of_the_decayed_group():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2))
    model(torch.zeros(1, 3, 5, 5))
    groups = parameter_groups(model, 0.0)
    optimizer = torch.optim.SGD(groups, lr=0.1, weight_decay=1e-4)
    decayed, exempt = optimizer.param_groups
    assert [p.shape for p in decayed["params"]] == [model[0].weight.shape, model[3].weight.shape]
    assert decayed["weight_decay"] == 1e-4
    assert {id(p) for p in exempt["params"]} == {id(model[1].weight), id(model[1].bias), id(model[3].bias)}
    assert exempt["weight_decay"] == 0.0
    assert len(torch.optim.SGD(parameter_groups(model, None), lr=0.1).param_groups) == 1


def test_label_smoothing_blends_the_label_with_a_uniform_target(tmp_path):
    identity = nn.Linear(3, 3, bias=False)
    nn.init.eye_(identity.weight)  # logits = inputs
    trainer = _trainer(identity, tmp_path, label_smoothing=0.3)
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    targets = torch.tensor([0, 1])
    _, loss = trainer.step(logits, targets, group_size=1, sync=True)
    log_p = torch.log_softmax(logits, dim=1)
    expected = (0.7 * -log_p[[0, 1], targets] + 0.3 * -log_p.mean(dim=1)).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_the_last_partial_accumulation_group_steps_on_its_own_mean_loss(tmp_path):
    """3 micro-batches in groups of 2: the last group holds one, whose loss is not halved."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,)))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=False)
    loaders = Loaders(DataLoader(data, batch_size=2, sampler=sampler), DataLoader(data), sampler)
    model = nn.Linear(4, 3)
    trainer = _trainer(model, tmp_path, loaders=loaders, accumulate_grad_batches=2, limit_train_batches=3)
    before_each_step = []
    step = trainer.optimizer_step
    trainer.optimizer_step = lambda: before_each_step.append(copy.deepcopy(model)) or step()
    trainer.train_epoch()
    assert len(before_each_step) == 2
    plain = before_each_step[-1]  # the weights the third micro-batch's step starts from
    plain.zero_grad(set_to_none=True)
    F.cross_entropy(plain(data.tensors[0][4:6]), data.tensors[1][4:6]).backward()
    for name, trained in model.named_parameters():
        expected = getattr(plain, name) - 0.1 * getattr(plain, name).grad  # one SGD step, lr 0.1
        assert torch.allclose(trained, expected, atol=1e-6), name


def _mixed(alpha_mixup: float, alpha_cutmix: float, batch: int = 0):
    images = torch.arange(8, dtype=torch.float32).view(8, 1, 1, 1).expand(8, 3, 6, 6).contiguous()
    labels = torch.arange(8) % 5
    return images, labels, Mixing(alpha_mixup, alpha_cutmix, num_classes=5, seed=0, rank=0)(images, labels, 3, batch)


def test_mixup_blends_each_image_with_its_neighbour_and_the_targets_alike():
    images, labels, (mixed, targets, dominant) = _mixed(0.2, 0.0)
    assert mixed.shape == images.shape and targets.shape == (8, 5)
    lam = targets[0, labels[0]].item()
    assert 0 < lam < 1
    rolled = images.roll(1, 0)
    assert torch.allclose(mixed, lam * images + (1 - lam) * rolled)
    assert torch.allclose(targets, lam * F.one_hot(labels, 5) + (1 - lam) * F.one_hot(labels.roll(1), 5))
    assert torch.equal(dominant, labels if lam >= 0.5 else labels.roll(1))


def test_cutmix_pastes_one_box_and_weights_the_targets_by_its_area():
    images, labels, (mixed, targets, dominant) = _mixed(0.0, 1.0)
    pasted = mixed != images  # sample i holds the value i, its neighbour i - 1 (sample 0's: 7) another
    assert all(torch.equal(pasted[i], pasted[0]) for i in range(8))  # one box for the whole batch
    area = pasted[0].float().mean().item()
    assert 0 < area < 1
    assert targets[1, labels[0]].item() == pytest.approx(area) and targets[1, labels[1]].item() == pytest.approx(
        1 - area
    )
    assert torch.equal(dominant, labels if area <= 0.5 else labels.roll(1))


def test_with_both_alphas_each_batch_is_either_a_pure_mixup_blend_or_a_pure_cutmix_paste():
    kinds = []
    for batch in range(20):
        images, labels, (mixed, targets, _) = _mixed(0.2, 1.0, batch)
        rolled = images.roll(1, 0)
        lam = targets[0, labels[0]].item()  # sample 0's own share (label 0; its neighbour's is 2)
        blend = torch.allclose(mixed, lam * images + (1 - lam) * rolled)
        pasted = mixed != images
        paste = (
            bool(((mixed == images) | (mixed == rolled)).all())  # every pixel its own or its neighbour's
            and bool(pasted.any())
            and all(torch.equal(pasted[i], pasted[0]) for i in range(8))  # one box
            and pasted[0].float().mean().item() == pytest.approx(1 - lam)  # the targets weigh its area
        )
        assert blend != paste, f"batch {batch}: blended {blend}, pasted {paste}"
        kinds.append("mixup" if blend else "cutmix")
    assert set(kinds) == {"mixup", "cutmix"}, kinds


def test_mixing_draws_from_its_own_seeded_stream():
    before = torch.get_rng_state()
    _, _, first = _mixed(0.2, 1.0, batch=4)
    _, _, again = _mixed(0.2, 1.0, batch=4)
    _, _, other = _mixed(0.2, 1.0, batch=5)
    assert torch.equal(torch.get_rng_state(), before)  # dropout's stream is left alone
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[1], other[1])


def test_ema_after_k_updates_matches_a_hand_computation():
    model = nn.Sequential(nn.Linear(2, 1), nn.BatchNorm1d(1))
    ema = EMA(model, decay=0.75)
    expected = None
    for k, value in enumerate([1.0, 3.0, -2.0, 5.0]):
        with torch.no_grad():
            model[0].weight.fill_(value)
            model[1].running_mean.fill_(2 * value)
        ema.update_parameters(model)
        expected = value if expected is None else 0.75 * expected + 0.25 * value  # the first update copies
        assert ema.module[0].weight.flatten().tolist() == pytest.approx([expected] * 2), k
        assert ema.module[1].running_mean.item() == pytest.approx(2 * expected), k  # buffers too
    assert int(ema.n_averaged) == 4


def test_ema_copies_the_weights_during_warmup_epochs():
    model = nn.Linear(1, 1)
    ema = EMA(model, decay=0.5, warmup_epochs=1)
    for value, epoch in ((1.0, 0), (3.0, 0), (5.0, 1), (7.0, 1)):
        with torch.no_grad():
            model.weight.fill_(value)
        ema.update_parameters(model, epoch)
    assert ema.module.weight.item() == pytest.approx(0.5 * 5.0 + 0.5 * 7.0)  # copied 5 after warmup, then averaged


def test_ema_decay_is_adjusted_for_batch_interval_and_epochs_as_torchvision_does():
    settings = TrainerConfig(batch_size=1024, epochs=600, ema_decay=0.99998, ema_every_n_steps=32)
    assert settings.ema_decay_per_update == pytest.approx(1 - 2e-5 * 1024 * 32 / 600)
    assert TrainerConfig().ema_decay_per_update is None


def test_an_ema_decay_adjusted_to_a_copy_of_the_model_is_refused_naming_the_least_that_averages():
    """Lightning's and timm's per-step decays (0.9, 0.95) adjust to 0 for a small job: the average
    would copy the model at each update, and validation would evaluate it twice."""
    with pytest.raises(ConfigError) as refused:
        TrainerConfig(batch_size=64, epochs=2, ema_decay=0.9)
    assert str(refused.value) == (
        "trainer.ema_decay=0.9: adjusted for global batch 64 x 1 micro-batches x every 1 step(s) over 2 epoch(s) "
        "as torchvision does, it is 0 per update, a copy of the model; give a decay above 0.96875 (torchvision's "
        "recipes: 0.99998), or null"
    )
    assert TrainerConfig(batch_size=64, epochs=2, ema_decay=0.96876).ema_decay_per_update > 0


def test_ema_decay_is_adjusted_for_the_micro_batches_each_step_accumulates():
    settings = TrainerConfig(
        batch_size=64, epochs=100, ema_decay=0.9999, ema_every_n_steps=2, accumulate_grad_batches=4
    )
    assert settings.ema_decay_per_update == pytest.approx(1 - 1e-4 * 64 * 4 * 2 / 100)


def test_top5_counts_the_label_among_the_five_highest_logits():
    logits = torch.tensor(
        [
            [9.0, 8, 7, 6, 5, 4, 3],  # label 0: top-1
            [9.0, 8, 7, 6, 5, 4, 3],  # label 4: fifth, top-5 only
            [9.0, 8, 7, 6, 5, 4, 3],  # label 5: sixth, neither
            [0.0, 1, 2, 3, 4, 5, 6],  # label 2: fifth from the top
        ]
    )
    targets = torch.tensor([0, 4, 5, 2])
    whole = Accumulator(torch.device("cpu"), validation=True)
    whole.update_validation(logits, targets, CrossEntropy())
    figures = whole.averages()
    assert (figures.acc, figures.acc5, figures.samples) == (0.25, 0.75, 4)
    split = Accumulator(torch.device("cpu"), validation=True)  # as two ranks' shards summed
    split.update_validation(logits[::2], targets[::2], CrossEntropy())
    split.update_validation(logits[1::2], targets[1::2], CrossEntropy())
    assert split.averages() == figures
    assert Accumulator(torch.device("cpu")).averages().acc5 is None  # training counts no top-5


def test_repeated_augmentation_gives_each_drawn_image_to_consecutive_ranks():
    data = list(range(10))
    single = RepeatedAugmentationSampler(data, num_replicas=1, rank=0, repetitions=3, seed=7)
    ranks = [RepeatedAugmentationSampler(data, num_replicas=2, rank=r, repetitions=3, seed=7) for r in range(2)]
    order = list(single)
    assert len(order) == len(single) == 10  # an epoch draws as many samples as the set holds
    assert order[:3] == [order[0]] * 3 and len(set(order)) == 4  # ceil(10 / 3) images, 3 times each
    interleaved = [index for pair in zip(*map(list, ranks)) for index in pair]
    assert interleaved == order  # the ranks' strides together are the single process's order
    single.set_epoch(1)
    assert list(single) != order and list(single) == list(single)


def test_torchvision_names_are_checked_with_the_closest_suggested():
    with pytest.raises(ConfigError, match=r"model.arch=resnt50: .*closest: resnet50"):
        check_torchvision("resnt50", in_channels=3, num_classes=10, weights=None)
    with pytest.raises(ConfigError, match="3-channel images but the dataset has 1"):
        check_torchvision("resnet18", in_channels=1, num_classes=10, weights=None)


def test_torchvision_weights_load_all_but_a_head_sized_for_other_classes(tmp_path):
    torch.manual_seed(0)
    source = torchvision_classifier("resnet18", num_classes=1000)
    torch.save(source.state_dict(), tmp_path / "resnet18.pth")
    model = torchvision_classifier("resnet18", num_classes=3, weights=str(tmp_path / "resnet18.pth"))
    assert torch.equal(model.conv1.weight, source.conv1.weight) and model.fc.out_features == 3
    torch.save(torchvision_classifier("resnet34", 10).state_dict(), tmp_path / "resnet34.pth")
    with pytest.raises(ConfigError, match="not a state_dict of this architecture"):
        torchvision_classifier("resnet18", num_classes=3, weights=str(tmp_path / "resnet34.pth"))


def test_an_image_folder_counts_its_classes_for_the_model(tmp_path):
    root = write_image_folder(tmp_path, classes=3, per_class=1, size=8)
    cfg = typed_config("dataset=imagefolder", f"dataset.root={root}", "model=simple_cnn")
    plan = check_and_plan(cfg)
    assert plan.num_classes == 3
    assert model_factory(cfg, plan.num_classes)().classifier[-1].out_features == 3


def test_recipe_sizes_and_augmentations_reach_the_transforms(tmp_path):
    root = write_image_folder(tmp_path, classes=2, per_class=1, size=300)
    cfg = typed_config(
        "dataset=imagefolder",
        f"dataset.root={root}",
        "dataset.train_crop=176",
        "dataset.val_resize=232",
        "dataset.val_crop=200",
        "dataset.auto_augment=ta_wide",
        "dataset.random_erase=0.1",
    ).dataset
    from PIL import Image

    image = Image.new("RGB", (300, 260))
    train, val = sample_transform(cfg, train=True), sample_transform(cfg, train=False)
    assert train(image).shape == (3, 176, 176) and val(image).shape == (3, 200, 200)
    names = [type(t).__name__ for t in train.transforms]
    assert names == ["RandomResizedCrop", "RandomHorizontalFlip", "TrivialAugmentWide", "PILToTensor", "RandomErasing"]
    assert train.transforms[-1].value == [124, 116, 104]  # uint8 erased to ImageNet's mean: 0 once normalised
    assert [type(t).__name__ for t in val.transforms][:2] == ["Resize", "CenterCrop"]
    assert val.transforms[0].size == 232
    assert sample_transform(replace(cfg, val_crop=None), train=False)(image).shape == (3, 224, 224)  # image_size


def test_a_checkpoint_resumes_only_with_the_warmup_it_trained_with(tmp_path):
    from models.mnist_net import MnistNet
    from training.checkpoint.files import save_checkpoint

    model = MnistNet(1, 10, 8)
    for name, scheduler in (("warm", {"target": [0.1], "epoch": 1, "last_step": 3, "after": None}), ("plain", None)):
        save_checkpoint(
            {"model": model.state_dict(), "optimizer": {}, "scheduler": scheduler, "epoch": 1, "step": 3, "best": 0.5},
            tmp_path / f"{name}.pt",
        )
    with pytest.raises(ConfigError, match="warm.pt trained with a warmup and cannot continue without one"):
        check_and_plan(typed_config(f"trainer.resume={tmp_path / 'warm.pt'}"))
    with pytest.raises(ConfigError, match="plain.pt trained without a warmup.*scheduler.warmup_epochs"):
        check_and_plan(typed_config(f"trainer.resume={tmp_path / 'plain.pt'}", "scheduler.warmup_epochs=2"))
    check_and_plan(typed_config(f"trainer.resume={tmp_path / 'warm.pt'}", "scheduler.warmup_epochs=2"))
    check_and_plan(typed_config(f"trainer.resume={tmp_path / 'warm.pt'}", "trainer.test_only=true"))


def test_a_checkpoint_resumes_only_with_the_schedule_it_trained_with(tmp_path):
    """Loading a scheduler's state puts its saved T_max back: more epochs would train at lr 0."""
    from models.mnist_net import MnistNet
    from training.checkpoint.files import save_checkpoint

    path = tmp_path / "cosine.pt"
    config = OmegaConf.to_yaml(compose_config("trainer.epochs=2"), resolve=True)  # as train.py saves it
    save_checkpoint(
        {
            "model": MnistNet(1, 10, 8).state_dict(),
            "optimizer": {},
            "scheduler": {"T_max": 2},
            "epoch": 2,
            "step": 46,
            "best": 0.5,
            "config": config,
        },
        path,
    )
    with pytest.raises(
        ConfigError,
        match=r"cosine.pt trained with scheduler.T_max=2, and this run asks for 4: .*"
        r"resume with trainer.epochs=2, which T_max follows, or train afresh",
    ):
        check_and_plan(typed_config(f"trainer.resume={path}", "trainer.epochs=4"))
    with pytest.raises(
        ConfigError,
        match=r"scheduler._target_=torch.optim.lr_scheduler.CosineAnnealingLR, .*"
        r"asks for torch.optim.lr_scheduler.StepLR: .*the scheduler it trained with",
    ):
        check_and_plan(typed_config(f"trainer.resume={path}", "trainer.epochs=2", "scheduler=step"))
    with pytest.raises(ConfigError, match="scheduler._target_=torch.optim.lr_scheduler.CosineAnnealingLR, .*for none"):
        check_and_plan(typed_config(f"trainer.resume={path}", "scheduler=none"))
    check_and_plan(typed_config(f"trainer.resume={path}", "trainer.epochs=2"))
    check_and_plan(typed_config(f"trainer.resume={path}", "trainer.epochs=4", "trainer.test_only=true"))
    # A warmup of another length: named before the T_max it also changes.
    warm = tmp_path / "warm.pt"
    config = OmegaConf.to_yaml(compose_config("trainer.epochs=4", "scheduler.warmup_epochs=1"), resolve=True)
    save_checkpoint(
        {
            "model": MnistNet(1, 10, 8).state_dict(),
            "optimizer": {},
            "epoch": 1,
            "step": 23,
            "best": 0.5,
            "scheduler": {"target": [0.05], "epoch": 1, "last_step": 23, "after": {}},
            "config": config,
        },
        warm,
    )
    with pytest.raises(ConfigError, match=r"warm.pt trained with scheduler.warmup_epochs=1, and this run asks for 2: "):
        check_and_plan(typed_config(f"trainer.resume={warm}", "trainer.epochs=4", "scheduler.warmup_epochs=2"))
    check_and_plan(typed_config(f"trainer.resume={warm}", "trainer.epochs=4", "scheduler.warmup_epochs=1"))


@pytest.mark.parametrize("policy, name", [("ra", "RandAugment"), ("augmix", "AugMix")])
def test_every_auto_augment_policy_transforms_small_grey_and_colour_images(policy, name):
    from PIL import Image

    for dataset, mode in (("mnist", "L"), ("cifar10", "RGB")):
        cfg = typed_config(f"dataset={dataset}", f"dataset.auto_augment={policy}").dataset
        transform = sample_transform(cfg, train=True)
        assert name in [type(t).__name__ for t in transform.transforms]
        size = cfg.image_size
        assert transform(Image.new(mode, (size, size), 128)).shape == (cfg.channels, size, size)


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["trainer.label_smoothing=1.0"], ["trainer.label_smoothing=1.0"]),
        (["trainer.ema_decay=1.5"], ["trainer.ema_decay=1.5", "0.99998"]),
        (["trainer.mixup_alpha=-1"], ["trainer.mixup_alpha=-1"]),
        (["scheduler.warmup_start_factor=0"], ["scheduler.warmup_start_factor=0"]),
        (["optimizer.lr_scaling=sqrt"], ["optimizer.lr_scaling=sqrt", "none, linear"]),
        (["optimizer.reference_batch=0"], ["optimizer.reference_batch=0"]),
        (["data.repeated_augmentations=0"], ["data.repeated_augmentations=0"]),
        (["dataset.auto_augment=ta_wide"], ["dataset.auto_augment=ta_wide", "dataset=digits"]),
        (
            ["dataset=mnist", "data.loader=device", "dataset.random_erase=0.5"],
            ["data.loader=device", "dataset.random_erase=0.5", "data.loader=dataloader"],
        ),
        (["dataset=cifar10", "dataset.train_crop=24"], ["dataset.train_crop=24", "dataset.val_resize"]),
        (["trainer.test_only=true"], ["trainer.test_only=true", "trainer.resume=<checkpoint>"]),
        (["model=torchvision", "dataset=synthetic", "model.weights=/nowhere.pth"], ["model.weights=/nowhere.pth"]),
    ],
)
def test_recipe_keys_are_checked_before_launch(overrides, words):
    with pytest.raises(ConfigError) as error:
        check_and_plan(typed_config("trainer.accelerator=cpu", *overrides))
    message = str(error.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_a_run_averages_with_the_adjusted_decay_not_the_raw_one(tmp_path, monkeypatch):
    """The run's EMA is built with the adjusted decay (the unit tests above hold the adjustment to
    torchvision's; this holds the run to using it)."""
    from training import run as run_job

    decays = []

    class Recorded(EMA):
        def __init__(self, model, decay, warmup_epochs=0):
            decays.append(decay)
            super().__init__(model, decay, warmup_epochs)

    monkeypatch.setattr(run_job, "EMA", Recorded)
    job = job_config(tmp_path, "debug=fdr", "trainer.ema_decay=0.999", "trainer.batch_size=32", "trainer.epochs=2")
    run_job.train(make_context(0, 0, 1, 1, "cpu", use_process_group=False), job)
    assert decays == [pytest.approx(1 - 0.001 * 32 / 2)] and decays[0] != 0.999
