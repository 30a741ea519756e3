"""Readers of the on-disk formats: what torchvision writes loads as is, anything malformed is one
line that names the file and the fix, and the download goes through torchvision's code."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import runpy
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

import download as download_command
from config.schema import DatasetConfig
from config.setup import ROOT
from data import DATASETS, OnDisk, build_loaders, check, cifar10, dataset_module, download, imagefolder, serving
from data.file_batches import EncodedFiles
from data.idx import IdxDataset, idx_bytes
from data.mnist import MNIST
from distributed.context import make_context
from errors import ConfigError
from tests import train_server
from tests.configs import typed_config
from tests.dataset_files import class_images, write_cifar, write_idx, write_image_folder, write_mac_leftovers


def _dataset(name: str, root: Path, *overrides: str):
    return typed_config(f"dataset={name}", f"dataset.root={root}", *overrides)


def test_cifar_batches_read_back_pixel_exact(tmp_path):
    written = write_cifar(tmp_path, per_batch=7, val=5)
    train, val = cifar10.read(tmp_path)
    assert train.images.shape == (35, 3, 32, 32) and train.images.dtype == torch.uint8
    assert torch.equal(train.images[7:14], torch.from_numpy(written["data_batch_2"][0]))
    assert torch.equal(val.labels, torch.from_numpy(written["test_batch"][1]))
    # The stored rows are R, G, B planes: pixel (c, y, x) is entry c*1024 + y*32 + x.
    row = written["test_batch"][0].reshape(5, -1)[3]
    assert int(val.images[3, 2, 5, 7]) == int(row[2 * 1024 + 5 * 32 + 7])


def _repickle_with_bytes_keys(path: Path, protocol: int) -> None:
    """What `pickle.dump(pickle.load(f, encoding="bytes"), out)` makes of a batch of the official
    release, which Python 2 pickled: its keys and strings come back as bytes."""
    entry = pickle.loads(path.read_bytes())
    as_bytes = {key.encode(): value.encode() if isinstance(value, str) else value for key, value in entry.items()}
    path.write_bytes(pickle.dumps(as_bytes, protocol=protocol))


@pytest.mark.parametrize("protocol", [2, 4, 5])  # 4: Python 3.8-3.13's default, 5: 3.14's
def test_cifar_batches_re_pickled_with_bytes_keys_read_the_same(tmp_path, protocol):
    write_cifar(tmp_path, per_batch=7, val=5)
    expected = cifar10.read(tmp_path)
    for path in cifar10.files(tmp_path):
        _repickle_with_bytes_keys(path, protocol)
    assert b"labels" in pickle.loads(cifar10.files(tmp_path)[0].read_bytes())
    for ours, theirs in zip(cifar10.read(tmp_path), expected):
        assert torch.equal(ours.images, theirs.images) and torch.equal(ours.labels, theirs.labels)


IDX_DATASETS = [name for name in DATASETS if isinstance(dataset_module(name), IdxDataset)]  # mnist, fashion_mnist, ...


@pytest.mark.parametrize("name", IDX_DATASETS)
def test_the_idx_reader_reads_what_torchvision_reads(tmp_path, name):
    import torchvision.datasets

    dataset = dataset_module(name)
    write_idx(tmp_path, train=30, val=10, dataset=dataset)
    ours, _ = dataset.read(tmp_path)
    theirs = getattr(torchvision.datasets, dataset.torchvision_class)(str(tmp_path), train=True)
    assert torch.equal(ours.images[:, 0], theirs.data) and torch.equal(ours.labels, theirs.targets)


def test_mnist_reads_gzipped_files(tmp_path):
    written = write_idx(tmp_path, train=30, val=10, gz=True)
    assert all(path.suffix == ".gz" for path in MNIST.files(tmp_path))
    _, val = MNIST.read(tmp_path)
    assert torch.equal(val.images[:, 0], torch.from_numpy(written["t10k-images-idx3-ubyte"]))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _pickle_that_runs_code(path: Path) -> None:
    class Exploit:
        def __reduce__(self):
            return os.system, ("echo pwned",)

    path.write_bytes(pickle.dumps({"data": Exploit(), "labels": []}))


def _assert_one_line_error(read, dataset: str, words: list[str]) -> None:
    """`read()` fails with one line that names the file's problem and the prep command."""
    with pytest.raises(ConfigError) as error:
        read()
    message = str(error.value)
    assert "\n" not in message and f"python download.py dataset={dataset}" in message
    for word in words:
        assert word in message


@pytest.mark.parametrize(
    "spoil, words",
    [
        (_truncate, ["data_batch_3", "not a CIFAR-10 batch"]),
        (lambda p: p.write_bytes(b"hello"), ["data_batch_3", "not a CIFAR-10 batch"]),
        (_pickle_that_runs_code, ["data_batch_3", "posix.system is not part of a CIFAR batch"]),
        (
            lambda p: p.write_bytes(pickle.dumps({b"images": np.zeros((2, 3072), np.uint8), b"targets": [0, 1]})),
            ["data_batch_3", "not a CIFAR-10 batch (KeyError: 'data')"],
        ),
        (lambda p: cifar10.write_batch(p, np.zeros((2, 3, 16, 16), np.uint8), np.zeros(2)), ["3072 pixels"]),
        (lambda p: cifar10.write_batch(p, np.zeros((2, 3, 32, 32), np.uint8), np.array([1, 10])), ["label in 0..9"]),
    ],
)
def test_malformed_cifar_batch_is_one_line_naming_the_file_and_fix(tmp_path, spoil, words):
    write_cifar(tmp_path, per_batch=4, val=4)
    spoil(tmp_path / cifar10.FOLDER / "data_batch_3")
    _assert_one_line_error(lambda: cifar10.read(tmp_path), "cifar10", words)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize(
    "spoil, words",
    [
        (_truncate, ["train-images-idx3-ubyte", "truncated"]),
        (lambda p: p.write_bytes(idx_bytes(np.zeros((4, 28), np.uint8))), ["bad header"]),
    ],
)
def test_malformed_mnist_file_is_one_line_naming_the_file_and_fix(tmp_path, gz, spoil, words):
    write_idx(tmp_path, train=20, val=10)
    images = MNIST.folder(tmp_path) / "train-images-idx3-ubyte"
    spoil(images)
    if gz:
        images.with_name(images.name + ".gz").write_bytes(gzip.compress(images.read_bytes()))
        images.unlink()
    _assert_one_line_error(lambda: MNIST.read(tmp_path), "mnist", words)


def test_truncated_gzip_and_label_count_mismatch_are_errors(tmp_path):
    write_idx(tmp_path, train=20, val=10, gz=True)
    labels = MNIST.folder(tmp_path) / "train-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.compress(idx_bytes(np.zeros(19, np.uint8))))
    with pytest.raises(ConfigError, match="20 images but train-labels-idx1-ubyte.gz has 19 labels"):
        MNIST.read(tmp_path)
    write_idx(tmp_path, train=20, val=10, gz=True)
    _truncate(MNIST.folder(tmp_path) / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(ConfigError, match="t10k-images-idx3-ubyte.gz: unreadable"):
        MNIST.read(tmp_path)


def test_missing_files_with_download_off_name_the_root_and_the_prep_command(tmp_path):
    cfg = _dataset("cifar10", tmp_path, "dataset.download=false")
    with pytest.raises(ConfigError) as error:
        check(cfg.dataset, cfg.data)
    message = str(error.value)
    assert f"{tmp_path} lacks cifar-10-batches-py/data_batch_1 and 5 more" in message
    assert f"python download.py dataset=cifar10 dataset.root={tmp_path}" in message


@pytest.mark.parametrize(
    "name, written, given",
    [
        ("cifar10", "data", "data/cifar-10-batches-py"),  # the dataset's own folder
        ("mnist", "data", "data/MNIST"),
        ("mnist", "data", "data/MNIST/raw"),
        ("cifar10", "data/unpacked", "data"),  # the archive unpacked into a folder of its own
    ],
)
def test_a_root_next_to_the_files_names_the_right_one_rather_than_downloading_a_second_copy(
    tmp_path, name, written, given
):
    # It downloaded a nested second copy (root/cifar-10-batches-py/cifar-10-batches-py/), or offline
    # said it could not download files the user had.
    writer = write_cifar if name == "cifar10" else write_idx
    writer(tmp_path / written)
    cfg = _dataset(name, tmp_path / given)  # dataset.download=true, as by default
    with pytest.raises(ConfigError) as error:
        check(cfg.dataset, cfg.data)
    assert f"holds {name}'s files in torchvision's layout; set dataset.root={tmp_path / written}" in str(error.value)
    sibling = _dataset(name, tmp_path / "data" / "new", "dataset.download=false")  # not inside: the usual message
    with pytest.raises(ConfigError, match="dataset.download=false and"):
        check(sibling.dataset, sibling.data)


def test_a_root_given_with_a_tilde_is_read_from_the_home_folder_torchvision_downloads_to(tmp_path, monkeypatch, capsys):
    # torchvision expanded `~` and we did not: the download went home while the files were looked for,
    # and a folder named `~` made, where the command was typed.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    write_idx(tmp_path / "home" / "data", train=20, val=10)
    assert download_command.main(["dataset=mnist", "dataset.root='~/data'"]) == 0, capsys.readouterr().err
    assert f"mnist: 20 training and 10 validation images in {tmp_path / 'home' / 'data'}" in capsys.readouterr().out
    assert not (tmp_path / "~").exists()
    images = write_image_folder(tmp_path / "home" / "images", classes=2, per_class=1, size=8)
    cfg = typed_config("dataset=imagefolder", "dataset.root='~/images'", "dataset.num_classes=2")
    check(cfg.dataset, cfg.data)
    assert cfg.dataset.root == str(images)


def test_check_reads_the_files_so_a_bad_one_fails_before_training(tmp_path):
    write_idx(tmp_path, train=20, val=10)
    _truncate(MNIST.folder(tmp_path) / "t10k-labels-idx1-ubyte")
    cfg = _dataset("mnist", tmp_path)
    with pytest.raises(ConfigError, match="t10k-labels-idx1-ubyte: header promises"):
        check(cfg.dataset, cfg.data)


def test_default_root_is_a_git_ignored_folder_outside_the_package_and_DATA_DIR_moves_it(monkeypatch):
    monkeypatch.delenv("DATA_DIR", raising=False)
    root = download.dataset_root(typed_config("dataset=cifar10").dataset)
    assert root == ROOT / "datasets" and Path(download.__file__).parent not in root.parents
    assert "datasets/" in (ROOT / ".gitignore").read_text().split()
    monkeypatch.setenv("DATA_DIR", "/shared/datasets")
    assert download.dataset_root(typed_config("dataset=mnist").dataset) == Path("/shared/datasets")


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["dataset.root=null"], ["dataset.root=null", "train/ and val/"]),
        (["dataset.root={missing}"], ["no train/ folder"]),
        (
            ["dataset.root={root}", "dataset.num_classes=1000"],
            ["dataset.num_classes=1000", "set dataset.num_classes=3"],
        ),
        (["dataset.root={root}", "dataset.num_classes=3", "data.loader=device"], ["data.loader=dataloader"]),
        (
            ["dataset.root={root}", "dataset.num_classes=3", "dataset.channels=1"],
            ["dataset.channels=1", "dataset.channels=3"],
        ),
        (
            ["dataset.root={root}", "dataset.num_classes=3", "data.decode=gpu", "dataset.auto_augment=ta_wide"],
            ["data.decode=gpu", "dataset.auto_augment=ta_wide", "data.decode=cpu", "dataset.auto_augment=null"],
        ),
        (
            ["dataset.root={root}", "dataset.num_classes=3", "data.decode=gpu", "dataset.random_erase=0.25"],
            ["dataset.random_erase=0.25", "dataset.random_erase=0"],
        ),
    ],
)
def test_image_folder_checks(tmp_path, overrides, words):
    root = write_image_folder(tmp_path / "images", classes=3, per_class=1, size=8)
    formatted = [o.format(root=root, missing=tmp_path / "nowhere") for o in overrides]
    cfg = typed_config("dataset=imagefolder", *formatted)
    with pytest.raises(ConfigError) as error:
        check(cfg.dataset, cfg.data)
    for word in words:
        assert word in str(error.value)


def test_image_folders_whose_classes_differ_are_named(tmp_path):
    root = write_image_folder(tmp_path / "images", classes=3, per_class=1, size=8)
    (root / "val" / "class2").rename(root / "val" / "class7")  # a typo'd, or a foreign, class folder
    cfg = typed_config("dataset=imagefolder", f"dataset.root={root}")
    with pytest.raises(ConfigError) as error:
        check(cfg.dataset, cfg.data)
    assert str(error.value) == (
        f"dataset.root={root}: train/ and val/ must hold the same class folders (only train/ has class2; only val/ "
        "has class7)"
    )


def test_image_folder_uses_imagenet_sizes_and_names_an_unreadable_image(tmp_path):
    root = write_image_folder(tmp_path, classes=2, per_class=2, size=40)
    cfg = typed_config("dataset=imagefolder", f"dataset.root={root}", "dataset.num_classes=2", "data.num_workers=0")
    loaders = build_loaders(cfg.dataset, cfg.data, make_context(0, 0, 1, 1, "cpu", use_process_group=False), 4, 0)
    assert next(iter(loaders.train))[0].shape == next(iter(loaders.val))[0].shape == (4, 3, 224, 224)
    bad = root / "val" / "class1" / "broken.png"
    bad.write_bytes(b"not a png")
    _, val = imagefolder.image_files(cfg.dataset)
    with pytest.raises(ConfigError, match="broken.png: unreadable image"):
        EncodedFiles(val)[len(val) - 1]


def _empty_class(root: Path, split: str, name: str = "class1", keep: str | None = None) -> None:
    """Leave root/split/name without images (with a stray non-image file `keep`)."""
    for path in (root / split / name).iterdir():
        path.unlink()
    if keep:
        (root / split / name / keep).write_text("not an image")


def test_an_empty_training_class_is_one_line_naming_the_folder_and_the_fix(tmp_path):
    root = write_image_folder(tmp_path, classes=3, per_class=2, size=8)
    _empty_class(root, "train", keep="labels.txt")
    cfg = typed_config("dataset=imagefolder", f"dataset.root={root}", "dataset.num_classes=3")
    with pytest.raises(ConfigError) as error:
        check(cfg.dataset, cfg.data)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"dataset.root={root}: train/class1/ holds no image (.jpg")
    assert "remove class1/ from both train/ and val/" in message
    nested = root / "train" / "class1" / "batch0" / "0.PNG"  # torchvision walks into subfolders, any case
    nested.parent.mkdir()
    (root / "train" / "class0" / "0.png").rename(nested)
    check(cfg.dataset, cfg.data)


def test_an_empty_validation_class_is_allowed_and_keeps_every_label_but_an_empty_val_is_not(tmp_path):
    root = write_image_folder(tmp_path, classes=3, per_class=2, size=8)
    _empty_class(root, "val")
    cfg = typed_config("dataset=imagefolder", f"dataset.root={root}", "dataset.num_classes=3")
    check(cfg.dataset, cfg.data)
    _, val = imagefolder.image_files(cfg.dataset)
    assert sorted(label for _, label in val) == [0, 0, 2, 2]  # class2 keeps its label
    for name in ("class0", "class2"):
        _empty_class(root, "val", name)
    with pytest.raises(ConfigError, match=rf"^dataset.root={root}: val/ holds no image .* in any class folder"):
        check(cfg.dataset, cfg.data)


def test_an_image_folder_copied_from_a_mac_holds_the_same_images_and_classes_as_the_original(tmp_path):
    # Its hidden ._0.png beside each image was listed as one, and its hidden .ipynb_checkpoints/
    # counted as the first class, which moved every other label by one.
    original, copied = (write_image_folder(tmp_path / name, classes=3, per_class=2, size=8) for name in ("a", "b"))
    write_mac_leftovers(copied)
    listed = {}
    for root in (original, copied):
        cfg = typed_config("dataset=imagefolder", f"dataset.root={root}", "dataset.num_classes=3")
        check(cfg.dataset, cfg.data)
        names, samples = imagefolder.class_names(cfg.dataset), imagefolder.image_files(cfg.dataset)
        listed[root] = names, [[(Path(path).relative_to(root), label) for path, label in split] for split in samples]
    assert listed[copied] == listed[original] and listed[copied][0] == ["class0", "class1", "class2"]
    for image in (copied / "train" / "class1").glob("[!.]*"):  # its hidden files alone left: no image to train on
        image.unlink()
    cfg = typed_config("dataset=imagefolder", f"dataset.root={copied}", "dataset.num_classes=3")
    with pytest.raises(
        ConfigError, match=r"train/class1/ holds no image \(.jpg .*; a hidden file, '.' first, is none\)"
    ):
        check(cfg.dataset, cfg.data)


class _FakeResponse(io.BytesIO):
    """What urllib.request.urlopen returns, serving bytes instead of the network."""

    def __init__(self, url: str, body: bytes) -> None:
        super().__init__(body)
        self.url, self.length = url, len(body)


def _serve(monkeypatch, files: dict[str, bytes]) -> list[str]:
    """Replace the network call under torchvision's download code; return the URLs fetched."""
    fetched = []

    def urlopen(request, *args, **kwargs):
        url = request.full_url
        name = url.rsplit("/", 1)[-1]
        if name not in files:
            raise urllib.error.URLError("no route to host")
        fetched.append(url)
        return _FakeResponse(url, files[name])

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return fetched


def _md5(data: bytes) -> str:
    import hashlib

    return hashlib.md5(data).hexdigest()


def test_cifar_download_fetches_and_unpacks_the_official_archive(tmp_path, monkeypatch):
    from torchvision.datasets import CIFAR10

    write_cifar(tmp_path / "source", per_batch=3, val=3)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        tar.add(tmp_path / "source" / cifar10.FOLDER, arcname=cifar10.FOLDER)
    fetched = _serve(monkeypatch, {CIFAR10.filename: archive.getvalue()})
    monkeypatch.setattr(CIFAR10, "tgz_md5", _md5(archive.getvalue()))
    root = tmp_path / "cache"
    assert download_command.main(["dataset=cifar10", f"dataset.root={root}"]) == 0
    assert CIFAR10.url in fetched
    train, _ = cifar10.read(root)
    assert len(train) == 15


@pytest.mark.parametrize("name", IDX_DATASETS)
def test_an_idx_download_uses_torchvisions_mirrors_and_md5s(tmp_path, monkeypatch, name):
    import torchvision.datasets

    dataset = dataset_module(name)
    torchvisions = getattr(torchvision.datasets, dataset.torchvision_class)
    write_idx(tmp_path / "source", train=12, val=6, gz=True, dataset=dataset)
    served = {path.name: path.read_bytes() for path in dataset.files(tmp_path / "source")}
    fetched = _serve(monkeypatch, served)
    monkeypatch.setattr(torchvisions, "resources", [(name, _md5(body)) for name, body in served.items()])
    cfg = _dataset(name, tmp_path / "cache")
    download.fetch(dataset, cfg.dataset)
    assert set(fetched) == {torchvisions.mirrors[0] + name for name in served}
    train, val = dataset.read(tmp_path / "cache")
    assert (len(train), len(val)) == (12, 6)


def test_a_failed_download_is_one_line_with_the_offline_command(tmp_path, monkeypatch, capsys):
    _serve(monkeypatch, {})
    assert download_command.main(["dataset=cifar10", f"dataset.root={tmp_path}"]) == 2
    message = capsys.readouterr().err.strip()
    assert message.startswith("error: could not download cifar10") and "\n" not in message
    assert "no route to host" in message and "python download.py dataset=cifar10" in message


def test_a_root_this_machine_cannot_write_is_one_line_naming_it_not_the_internet(tmp_path, monkeypatch, capsys):
    # It said to download on a machine with internet, which would not have helped.
    _serve(monkeypatch, {})
    (tmp_path / "a_file").write_text("")
    assert download_command.main(["dataset=mnist", f"dataset.root={tmp_path / 'a_file'}"]) == 2
    assert capsys.readouterr().err == (
        f"error: dataset.root={tmp_path / 'a_file'}: cannot write there ({tmp_path / 'a_file'} is a file, not a "
        "folder); give dataset.root (or paths.data_dir) a folder you can write\n"
    )


@pytest.mark.parametrize(
    "argv, words",
    [
        (["dataset=mnsit"], [f"dataset=mnsit: choose one of {', '.join(serving(OnDisk))}, the datasets with files"]),
        (["dataset=digits"], [f"dataset=digits: choose one of {', '.join(serving(OnDisk))}, the datasets with files"]),
        (["dataset=mnist", "paths.dat_dir=/x"], ["Could not override 'paths.dat_dir'", "--help"]),
        (["dataset=mnist", "dataset.download=maybe"], ["dataset.download=maybe", "not a valid bool", "--help"]),
        (["--cfg", "job"], ["--cfg: not an option", "--help"]),
    ],
)
def test_the_download_command_answers_a_bad_argument_in_one_line(capsys, argv, words):
    assert download_command.main(argv) == 2
    out, err = capsys.readouterr()
    assert not out and err.startswith("error: ") and err.count("\n") == 1
    for word in words:
        assert word in err


def test_the_download_command_has_a_usage_text(capsys):
    assert download_command.main(["--help"]) == 0
    downloadable = serving(OnDisk)
    assert {"mnist", "fashion_mnist", "kmnist", "cifar10"} <= set(downloadable)
    assert capsys.readouterr().out.startswith(f"usage: python download.py dataset={'|'.join(downloadable)} ")


def test_the_download_commands_old_name_says_its_new_one(monkeypatch):
    monkeypatch.setattr("sys.argv", ["data/download.py", "dataset=mnist"])
    with pytest.raises(SystemExit, match=r"^error: this command is now `python download.py dataset=mnist`$"):
        runpy.run_path(str(ROOT / "data" / "download.py"), run_name="__main__")


def test_class_images_carry_their_label():
    labels = np.arange(10)
    means = class_images(labels, 3, 32, seed=0).reshape(10, 3, -1).mean(-1)
    assert len({tuple(np.round(m, -1)) for m in means}) == 10


def _download_on_two_ranks(rank: int, port: int, archive: bytes, root: str, out: str) -> None:
    """One of two gloo ranks calling data.download.prepare: first offline, then with the archive served."""
    from torchvision.datasets import CIFAR10

    from distributed import context

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ctx = make_context(rank, rank, 2, 2, "cpu", use_process_group=True)
    context.init(ctx, timeout_s=60)
    patch = pytest.MonkeyPatch()  # a spawned process has no fixtures
    cfg = DatasetConfig(name="cifar10", channels=3, image_size=32, num_classes=10, root=root)
    outcomes = []
    try:
        for files in ({}, {CIFAR10.filename: archive}):
            fetched = _serve(patch, files)
            patch.setattr(CIFAR10, "tgz_md5", _md5(archive))
            try:
                download.prepare(cifar10, cfg, ctx)
                outcomes.append(f"ok after {len(fetched)} requests")
            except ConfigError as e:
                outcomes.append(str(e))
        Path(out, f"rank{rank}.txt").write_text("\n".join(outcomes))
    finally:
        patch.undo()
        context.shutdown(ctx, clean=True)


@pytest.mark.slow
def test_in_ddp_rank_zero_downloads_once_and_every_rank_learns_the_outcome(tmp_path):
    import socket

    import torch.multiprocessing as mp

    write_cifar(tmp_path / "source", per_batch=3, val=3)
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        tar.add(tmp_path / "source" / cifar10.FOLDER, arcname=cifar10.FOLDER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = tmp_path / "cache"
    train_server.ensure_running()  # the two ranks fork from it: nothing left to import
    mp.start_processes(
        _download_on_two_ranks,
        args=(port, archive.getvalue(), str(root), str(tmp_path)),
        nprocs=2,
        start_method="forkserver",
    )
    offline = [Path(tmp_path, f"rank{r}.txt").read_text().splitlines() for r in range(2)]
    assert offline[0][0] == offline[1][0] and offline[0][0].startswith("could not download cifar10")
    assert offline[0][1] == "ok after 2 requests"  # torchvision asks once for redirects, once for the file
    assert offline[1][1] == "ok after 0 requests"
    assert len(cifar10.read(root)[0]) == 15
