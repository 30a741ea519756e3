"""Any torchvision classifier by name (torchvision.models.get_model), with the dataset's classes
and, optionally, weights from a local state_dict file (compute nodes have no internet)."""

from __future__ import annotations

from torch import nn

from errors import ConfigError
from models.arch import unknown_arch
from models.weights import check_fits, load_matching

# googlenet and inception_v3 return (logits, auxiliary logits) in train mode unless built without
# their auxiliary heads, and the loss takes logits alone. torchvision's own files carry the heads
# (googlenet's untrained), so their keys are dropped when loading. init_weights=True is the default
# torchvision warns it will change; saying it keeps these models as they were and the log quiet.
_AUX_HEADS = {"googlenet": ("aux1.", "aux2."), "inception_v3": ("AuxLogits.",)}


def torchvision_classifier(arch: str, num_classes: int, in_channels: int = 3, weights: str | None = None) -> nn.Module:
    """`weights` (e.g. torchvision's resnet50-11ad3fa6.pth) load into every tensor of the same
    shape; the classifier's, sized for other classes, keep their fresh initialisation."""
    import torchvision  # lazy: slow to import, and only this model needs it

    without_aux = {"aux_logits": False, "init_weights": True} if arch in _AUX_HEADS else {}
    model = torchvision.models.get_model(arch, num_classes=num_classes, **without_aux)
    if weights is not None:
        load_matching(model, weights, unused=_AUX_HEADS.get(arch, ()))
    return model


def check(arch: str, in_channels: int, num_classes: int, weights: str | None) -> None:
    """Before launch: a name torchvision knows, images it can take, weights that fit."""
    import torchvision

    names = torchvision.models.list_models(module=torchvision.models)  # classifiers, not detection/video
    if arch not in names:
        raise unknown_arch(arch, names, "classifier", "see torchvision.models.list_models()")
    if in_channels != 3:
        raise ConfigError(
            f"model=torchvision takes 3-channel images but the dataset has {in_channels}; "
            "use a colour dataset (cifar10, imagefolder, synthetic) or model=resnet18/resnet50"
        )
    if weights is not None:
        check_fits(torchvision_classifier(arch, num_classes, in_channels), weights, unused=_AUX_HEADS.get(arch, ()))
