"""Using a trained model (docs/using.md): python predict.py and python export.py on what single, DDP
and FSDP runs leave, and the manifest they leave in their run dir and in every checkpoint."""

from __future__ import annotations

import csv
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import export
import predict
from config.schema import DataConfig, DatasetConfig
from config.setup import ROOT
from data.digits import arrays
from data.image_paths import image_files_under, image_paths, is_image, validation_image
from errors import ConfigError
from preflight import check_and_plan
from tests import train_server
from tests.configs import typed_config
from tests.dataset_files import write_image_folder, write_mac_leftovers
from tests.runs import PASSWORD, SECRET_ROOT, last_weights, run_train
from trained import Trained, load
from training.checkpoint import sharded
from training.checkpoint.weights import best_weights, checkpoint_path, start_from
from training.precision import Precision

DIGITS = DatasetConfig(name="digits", channels=1, image_size=8, num_classes=10, mean=[0.3053], std=[0.3760])


@pytest.fixture(scope="module")
def single_run(tmp_path_factory) -> Path:
    """A tiny single-device run with an EMA (that differs from the model)."""
    run_dir = tmp_path_factory.mktemp("single") / "run"
    result = run_train(run_dir, "debug=fdr", "trainer.ema_decay=0.999")
    assert result.returncode == 0, result.stderr
    (run_dir / "console.txt").write_text(result.stdout + result.stderr)
    return run_dir


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """Five validation digits as grey PNGs (0..16 scaled to 0..255), and a file that is no image."""
    folder = tmp_path_factory.mktemp("images")
    _, val = arrays(DIGITS)
    for i in range(5):
        pixels = (val.images[i, 0].double() * 255 / 16).round().to(torch.uint8).numpy()
        Image.fromarray(pixels).save(folder / f"digit{i}.png")
    (folder / "broken.png").write_bytes(b"not a png")
    return folder


def _expected(state: dict[str, torch.Tensor], files: list[Path]) -> torch.Tensor:
    """The run's model, its weights `state`, on the files' pixels / 255 normalised as digits is:
    probabilities computed here without predict.py's code."""
    from models.mnist_net import MnistNet

    model = MnistNet(in_channels=1, num_classes=10, image_size=8)
    model.load_state_dict(state)
    pixels = torch.stack([torch.from_numpy(np.array(Image.open(f))).float() for f in files])[:, None]
    with torch.no_grad():
        return model.eval()((pixels / 255 - 0.3053) / 0.3760).softmax(1)


def _rows(path: Path) -> dict[str, list[str]]:
    with path.open() as f:
        return {Path(row[0]).name: row[1:] for row in list(csv.reader(f))[1:]}


def _probabilities(row: list[str]) -> dict[int, float]:
    """label -> probability, from a CSV row's (class, label, probability) triples."""
    return {int(row[i + 1]): float(row[i + 2]) for i in range(0, len(row), 3)}


@pytest.mark.slow
def test_predict_classifies_a_folder_and_names_a_corrupt_image_in_one_line(single_run, images, tmp_path):
    out = tmp_path / "predictions.csv"
    result = train_server.run(
        [str(single_run), str(images), "--top-k", "3", "--out", str(out)], script=ROOT / "predict.py", timeout=120
    )
    assert result.returncode == 1, result.stderr  # an image could not be read; the others are written
    assert result.stderr.splitlines() == [
        f"skipped {images / 'broken.png'}: unreadable image (not an image file PIL knows); delete or replace it"
    ]
    rows = _rows(out)
    files = sorted(images.glob("digit*.png"))
    assert sorted(rows) == [f.name for f in files]
    best = torch.load(single_run / "checkpoints" / "best.pt", weights_only=True)
    assert best["best_weights"] == "model"  # the model's weights scored best: what predict.py takes
    expected = _expected(best["model"], files)
    for f, probabilities in zip(files, expected):
        row = rows[f.name]
        assert row[0] == row[1] == str(probabilities.argmax().item())  # digits' class names are the digits
        for label, p in _probabilities(row).items():
            assert p == pytest.approx(probabilities[label].item(), abs=1e-6)
    assert f"{files[0]}: " in result.stdout and "5 of 6 image(s) classified" in result.stdout


@pytest.mark.slow
def test_predict_classifies_the_images_of_a_folder_copied_from_a_mac_alone(single_run, images, tmp_path):
    # Each hidden AppleDouble ._digit0.png was "skipped ...: unreadable image", and exit 1; the
    # copies in .ipynb_checkpoints/ were classified as images of their own.
    folder = tmp_path / "photos"
    folder.mkdir()
    files = [folder / f.name for f in sorted(images.glob("digit*.png"))]
    for f in files:
        f.write_bytes((images / f.name).read_bytes())
    write_mac_leftovers(folder)
    out = tmp_path / "predictions.csv"
    result = train_server.run(
        [str(single_run), str(folder), "--out", str(out)], script=ROOT / "predict.py", timeout=120
    )
    assert (result.returncode, result.stderr) == (0, "")
    with out.open() as written:
        assert [row[0] for row in list(csv.reader(written))[1:]] == [str(f) for f in files]
    assert "5 of 5 image(s) classified" in result.stdout


def _ema_weights(ema: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The averaged model's own, out of AveragedModel's state."""
    return {k.removeprefix("module."): v for k, v in ema.items() if k != "n_averaged"}


@pytest.mark.slow
def test_predict_takes_the_ema_weights_ddps_best_pt_and_fsdps_sharded_last_pt(
    single_run, ddp_reference, fsdp_reference, images, tmp_path
):
    files = sorted(images.glob("digit*.png"))
    sharded = fsdp_reference / "checkpoints" / "last.pt"
    ema_model = _ema_weights(torch.load(single_run / "checkpoints" / "last.pt", weights_only=True)["ema"])
    cases = [
        ([str(single_run / "checkpoints" / "last.pt"), "--weights", "ema"], ema_model),
        ([str(ddp_reference)], torch.load(ddp_reference / "checkpoints" / "best.pt", weights_only=True)["model"]),
        ([str(sharded)], last_weights(fsdp_reference)),
    ]
    assert sharded.is_dir()
    for source, state in cases:
        out = tmp_path / "p.csv"
        assert predict.main([source[0], str(images / "digit*.png"), "--out", str(out), *source[1:]]) == 0
        rows = _rows(out)
        for f, probabilities in zip(files, _expected(state, files)):
            got = _probabilities(rows[f.name])
            assert got == pytest.approx({k: probabilities[k].item() for k in got}, abs=1e-6), source
    model = torch.load(single_run / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert not torch.allclose(_expected(model, files), _expected(ema_model, files))  # the EMA's are its own


@pytest.mark.slow
def test_the_manifest_is_in_the_run_dir_and_in_every_checkpoint(single_run, ddp_reference, fsdp_reference):
    for run_dir, world in ((single_run, 1), (ddp_reference, 2), (fsdp_reference, 2)):
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["world_size"] == world and len(manifest["ranks"]) == world
        assert manifest["class_names"] == [str(d) for d in range(10)] and manifest["batch_per_rank"] == 64 // world
        assert manifest["commit"] and (run_dir / "manifest.diff").exists() == bool(manifest["diff"])
        checkpoints = run_dir / "checkpoints"
        for path in (checkpoints / "best.pt", checkpoints / "last.pt"):
            saved = sharded.describe(path) if path.is_dir() else torch.load(path, weights_only=True)
            assert saved["manifest"] == manifest, path


@pytest.mark.slow
def test_a_password_in_an_override_is_refused_before_anything_is_written(tmp_path):
    run_dir = tmp_path / "run"
    result = run_train(run_dir, "debug=fdr", f"dataset.root={SECRET_ROOT}")
    assert result.returncode == 2 and not run_dir.exists()
    assert result.stderr.startswith("error: dataset.root=https://user:***@example.org/data: a password or key ")
    assert PASSWORD not in result.stdout + result.stderr


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_a_password_in_a_config_file_is_refused_before_anything_is_written(tmp_path, sweep):
    """Hydra would write it, as the file does, to .hydra/config.yaml (a sweep's to multirun.yaml)."""
    (tmp_path / "conf" / "local").mkdir(parents=True)
    (tmp_path / "conf" / "local" / "site.yaml").write_text(f"# @package _global_\ndataset:\n  root: {SECRET_ROOT}\n")
    out = tmp_path / "out"
    where = ["-m", f"hydra.sweep.dir={out}", "trainer.seed=1,2"] if sweep else [f"hydra.run.dir={out}"]
    result = train_server.run(["--config-dir", str(tmp_path / "conf"), *where, "+local=site", "debug=fdr"])
    assert result.returncode == 2 and not out.exists()
    assert result.stderr.startswith("error: dataset.root=https://user:***@example.org/data: a password or key in a")
    assert len(result.stderr.splitlines()) == 1 and PASSWORD not in result.stdout + result.stderr


def test_images_are_files_folders_and_globs_each_cut_as_validation_cuts(images, tmp_path):
    files = sorted(str(f) for f in images.iterdir())
    assert image_paths([str(images)]) == files  # a folder: its image files (broken.png too: decoding tells)
    one, zero = str(images / "digit1.png"), str(images / "digit0.png")
    assert image_paths([one, str(images / "digit[01].png")]) == [one, zero]  # in the order given, each once
    with pytest.raises(ConfigError, match=r"nothing\*\.png: is no file, and no folder or glob that finds one"):
        image_paths([str(images / "nothing*.png")])
    photo = tmp_path / "photo.jpg"
    Image.new("RGB", (64, 48), (200, 30, 30)).save(photo)
    imagenet = DatasetConfig(name="imagefolder", channels=3, image_size=16, val_resize=20, val_crop=16)
    assert validation_image(str(photo), imagenet).shape == (3, 16, 16)
    grey = validation_image(str(photo), DIGITS)
    assert grey.shape == (1, 8, 8) and grey.dtype == torch.uint8  # uint8 until the device
    assert abs(int(grey[0, 4, 4]) - round(0.299 * 200 + 0.587 * 30 + 0.114 * 30)) <= 1  # grey as PIL makes it


def test_a_folder_to_predict_is_walked_through_its_symlinked_subfolders(images, tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "linked").symlink_to(images, target_is_directory=True)
    assert image_paths([str(tmp_path / "photos")]) == sorted(
        str(tmp_path / "photos" / "linked" / f.name) for f in images.iterdir()
    )


@pytest.mark.parametrize(
    ("relative", "image"),
    [
        ("cat.jpg", True),
        ("a/b/cat.JPEG", True),
        ("cat.txt", False),
        ("._cat.jpg", False),  # macOS's AppleDouble file: resource-fork metadata
        (".DS_Store", False),
        (".hidden.png", False),
        (".ipynb_checkpoints/cat-checkpoint.jpg", False),
        ("cats/.ipynb_checkpoints/cat.jpg", False),
        ("v1.2/cat.jpg", True),  # a dot inside a name hides nothing
    ],
)
def test_an_image_is_a_file_with_an_image_extension_and_no_hidden_name_on_its_path(relative, image):
    assert is_image(relative) == image


def test_a_folder_to_predict_lists_no_hidden_file_nor_anything_in_a_hidden_folder(images, tmp_path):
    folder = tmp_path / "under" / ".cache" / "photos"  # hidden above the folder given: not its business
    (folder / "more").mkdir(parents=True)
    real = [folder / "more" / "digit0.png", folder / "digit1.png"]
    for f in real:
        f.write_bytes((images / f.name).read_bytes())
    write_mac_leftovers(folder)
    assert image_files_under(folder) == sorted(real, key=str)
    assert image_paths([str(folder)]) == sorted(map(str, real))


@pytest.mark.slow
def test_a_run_dir_gives_its_best_pt_else_its_last_pt_and_a_bad_source_is_one_line(single_run, tmp_path):
    assert checkpoint_path(single_run) == single_run / "checkpoints" / "best.pt"
    assert checkpoint_path(single_run / "checkpoints") == single_run / "checkpoints" / "best.pt"
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes((single_run / "checkpoints" / "last.pt").read_bytes())
    assert checkpoint_path(run) == run / "checkpoints" / "last.pt"
    (run / "checkpoints" / "best.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=r"best.pt: not a loadable checkpoint \(.*\); give a run dir") as error:
        load(run)
    assert "\n" not in str(error.value)
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    with pytest.raises(ConfigError, match="no checkpoints/best.pt or last.pt in it"):
        checkpoint_path(tmp_path / "empty")
    (tmp_path / "photos").mkdir()
    with pytest.raises(ConfigError, match="neither a run dir"):
        checkpoint_path(tmp_path / "photos")
    with pytest.raises(ConfigError, match="holds no EMA weights"):
        load(_without_ema(single_run, tmp_path), "ema")


def test_a_folder_of_runs_names_them_in_one_line(tmp_path, capsys):
    # A -m sweep's folder (or a day's, outputs/<date>) given for its run was "neither a run dir nor a
    # sharded checkpoint; give a run dir": the runs it holds went unnamed. Named in job order (job 10
    # came second).
    sweep = tmp_path / "sweep"
    for job in ("0_optimizer-sgd", "1_optimizer-adamw", "2_lr-0.1", "3_lr-0.01", "10_lr-1"):
        (sweep / job / "checkpoints").mkdir(parents=True)
    (sweep / ".submitit" / "logs").mkdir(parents=True)  # no run: not named
    assert predict.main([str(sweep), str(tmp_path)]) == 2
    runs = f"{sweep / '0_optimizer-sgd'}, {sweep / '1_optimizer-adamw'}, {sweep / '2_lr-0.1'}, ... 2 more"
    fix = f"give one of them ({runs}); python -m bench.report {sweep} compares them"
    assert capsys.readouterr() == ("", f"error: {sweep}: holds 5 runs, not one; {fix}\n")
    with pytest.raises(ConfigError, match=rf"{tmp_path}: holds 5 runs, not one; give one of them \({sweep}/0_"):
        checkpoint_path(tmp_path)  # two levels down, as outputs/<date>/<time>


def test_a_file_that_is_no_checkpoint_says_what_it_is_in_one_line(tmp_path, capsys):
    # torch's own words were the reason given: an export.py .pt2 "is corrupted ... not saved
    # properly", a JSON file should be "torch.save'd with _use_new_zipfile_serialization=True".
    (tmp_path / "export").mkdir()
    with zipfile.ZipFile(tmp_path / "export" / "model.pt2", "w") as archive:
        archive.writestr("model/extra/metadata.json", "{}")
    (tmp_path / "export" / "model.onnx").write_bytes(b"\x08\x07")
    (tmp_path / "metrics.json").write_text("{}")
    exported = "a model export.py wrote, not a checkpoint; give the run dir it was exported from"
    not_zip = "not a loadable checkpoint (not a zip archive as torch.save writes: another kind of file, or a truncated"
    for cli, name, words in [
        (predict, "export/model.pt2", exported),
        (export, "export/model.onnx", exported),
        (predict, "metrics.json", not_zip),
    ]:
        assert cli.main([str(tmp_path / name), *([str(tmp_path)] if cli is predict else [])]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith(f"error: {tmp_path / name}: {words}") and captured.err.count("\n") == 1


def test_an_out_that_cannot_take_the_output_is_one_line_before_any_work(single_run, images, tmp_path, capsys):
    # A folder given as predict.py's --out was a traceback once every image had been classified;
    # a file given as export.py's, a traceback.
    (tmp_path / "a_file").write_text("")
    fix = "give a path you can write"
    refusals = [
        (predict, images, f"is a folder; give the CSV's file name, e.g. --out={images / 'predictions.csv'}"),
        (
            predict,
            tmp_path / "a_file" / "deeper" / "p.csv",
            f"cannot write there ({tmp_path / 'a_file'} is a file, not a folder); {fix}",
        ),
        (predict, Path("/proc/p.csv"), f"cannot write there (No such file or directory); {fix}"),
        (export, tmp_path / "a_file", f"cannot write there ({tmp_path / 'a_file'} is a file, not a folder); {fix}"),
    ]
    for cli, out, words in refusals:
        args = [str(single_run), *([str(images)] if cli is predict else []), "--out", str(out)]
        assert cli.main(args) == 2
        captured = capsys.readouterr()
        assert captured.err == f"error: --out={out}: {words}\n"
        assert captured.out == ""  # nothing classified, nothing exported
    made = tmp_path / "new" / "folder" / "p.csv"  # a folder it can make is made
    assert predict.main([str(single_run), str(images), "--out", str(made), "--num-workers", "0"]) == 1
    assert len(_rows(made)) == 5


def test_a_device_this_machine_lacks_is_one_line_before_any_work(single_run, images, monkeypatch, capsys):
    # --device mps on Linux, meta, or cuda:1 on a one-GPU machine: torch names the device, and it
    # failed only once the run was loaded, in a traceback.
    refusals = [("mps", "no mps device; use --device cpu"), ("meta", "no meta device; use --device cpu")]
    for device, words in refusals:
        assert predict.main([str(single_run), str(images), "--device", device]) == 2
        assert capsys.readouterr() == ("", f"error: --device={device}: this machine has {words}\n")
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)  # as on a one-GPU machine
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 1)
    assert predict.main([str(single_run), str(images), "--device", "cuda:1"]) == 2
    assert capsys.readouterr() == ("", "error: --device=cuda:1: this machine has 1 cuda device(s); use cuda:0\n")
    assert predict.main([str(single_run), str(images), "--device", "xpu"]) == 2
    assert (
        capsys.readouterr().err
        == "error: --device=xpu: this machine has no xpu device; use --device cpu or --device cuda\n"
    )


def test_an_image_too_large_for_pil_is_one_line_and_the_others_are_classified(
    single_run, images, tmp_path, monkeypatch, capsys
):
    # PIL refuses an image over twice its pixel limit (a 180-megapixel scan) with an error that is no
    # OSError: it was a traceback, and no image was classified.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2_000)  # a 100 x 100 image is then as a huge one
    huge = tmp_path / "huge.png"
    Image.new("L", (100, 100)).save(huge)
    out = tmp_path / "p.csv"
    assert predict.main([str(single_run), str(images / "digit0.png"), str(huge), "--out", str(out)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"skipped {huge}: too large to decode (Image size (10000 pixels)")
    assert err[0].endswith("; replace it with a smaller copy, or delete it")
    assert list(_rows(out)) == ["digit0.png"]


def test_best_weights_are_those_that_scored_the_ranked_figure_at_this_checkpoint(single_run, tmp_path):
    # Ranked by val/loss, the EMA's scored best.pt while the model's accuracy stayed the run's best:
    # the best weights were the model's, which did not earn best.pt its place.
    checkpoint = torch.load(single_run / "checkpoints" / "last.pt", weights_only=True)
    at, other = {"epoch": 3, "step": 30}, {"epoch": 2, "step": 20}
    ranked = {"monitor": "val/loss", "mode": "min", "kept": [{**at, "value": 0.5, "weights": "ema", "name": "best.pt"}]}
    assert best_weights({**checkpoint, **at, "best_weights": "model", "best_checkpoints": ranked}) == "ema"
    # A save between validations (or of an epoch outside the best): the run's best accuracy's.
    assert best_weights({**checkpoint, **other, "best_weights": "model", "best_checkpoints": ranked}) == "model"
    assert best_weights({**checkpoint, **other, "best_weights": "ema", "best_checkpoints": None}) == "ema"
    path = tmp_path / "best.pt"
    torch.save({**checkpoint, **at, "best_weights": "model", "best_checkpoints": ranked}, path)
    assert load(path).weights == "ema"


def _without_ema(single_run: Path, tmp_path: Path) -> Path:
    checkpoint = torch.load(single_run / "checkpoints" / "last.pt", weights_only=True)
    path = tmp_path / "no_ema.pt"
    torch.save({**checkpoint, "ema": None}, path)
    return path


@pytest.mark.slow
def test_export_writes_pt2_and_onnx_from_fsdps_sharded_checkpoint_each_checked_and_labelled(
    fsdp_reference, images, tmp_path, capsys
):
    result = train_server.run(
        [str(fsdp_reference / "checkpoints" / "last.pt"), "--out", str(tmp_path)], script=ROOT / "export.py"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("matches PyTorch on 2 validation batch(es)") == 2
    import onnx
    import onnxruntime

    metadata = {p.key: p.value for p in onnx.load(tmp_path / "model.onnx").metadata_props}
    assert json.loads(metadata["class_names"]) == [str(d) for d in range(10)]
    assert (json.loads(metadata["mean"]), json.loads(metadata["std"])) == ([0.3053], [0.376])
    extra = {export.METADATA: ""}
    program = torch.export.load(tmp_path / "model.pt2", extra_files=extra)
    assert json.loads(extra[export.METADATA]) == metadata_json(metadata)
    model = load(fsdp_reference / "checkpoints" / "last.pt").model
    x = torch.randn(3, 1, 8, 8)  # a batch size the export never saw
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        expected = model(x)
    assert torch.allclose(torch.from_numpy(session.run(None, {"images": x.numpy()})[0]), expected, atol=1e-4)
    assert torch.allclose(program.module()(x), expected, atol=1e-4)
    # docs/using.md's Python, as someone without this repo runs it, on these files
    code = (ROOT / "docs" / "using.md").read_text().split("```python\n", 1)[1].split("```", 1)[0]
    code = code.replace("outputs/digits/export", str(tmp_path)).replace("photos/seven.png", str(images / "digit0.png"))
    exec(compile(code, "docs/using.md", "exec"), {})
    top1 = str(_expected(last_weights(fsdp_reference), [images / "digit0.png"])[0].argmax().item())
    assert capsys.readouterr().out.splitlines() == [top1, top1]  # the ONNX file's answer, then the .pt2's


def metadata_json(props: dict[str, str]) -> dict:
    """ONNX's metadata_props (strings, JSON where a value is not one) as the .pt2's metadata.json holds them."""
    parsed = {}
    for key, value in props.items():
        try:
            parsed[key] = json.loads(value)
        except ValueError:
            parsed[key] = value
    return parsed


@pytest.mark.slow
def test_export_from_single_and_ddp_runs_checked(single_run, ddp_reference, tmp_path, capsys):
    assert export.main([str(single_run), "--format", "pt2", "--weights", "ema", "--out", str(tmp_path / "s")]) == 0
    assert export.main([str(ddp_reference), "--format", "pt2", "--out", str(tmp_path / "d")]) == 0
    assert capsys.readouterr().out.count("matches PyTorch") == 2
    extra = {export.METADATA: ""}
    torch.export.load(tmp_path / "s" / "model.pt2", extra_files=extra)
    assert json.loads(extra[export.METADATA])["weights"] == "ema"


@pytest.mark.slow
def test_export_of_a_run_whose_dataset_moved_names_data_root_which_finds_it(tmp_path, capsys):
    """The run dir copied to another machine: its dataset.root is not there."""
    images = write_image_folder(tmp_path / "images", classes=2, per_class=2, size=8)
    run_dir = tmp_path / "run"
    small = ["dataset.image_size=8", "dataset.resize=8", "model=simple_cnn"]
    trained = run_train(run_dir, "debug=fdr", "dataset=imagefolder", f"dataset.root={images}", *small)
    assert trained.returncode == 0, trained.stderr
    moved = images.rename(tmp_path / "moved")
    assert export.main([str(run_dir), "--format", "pt2", "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(
        f"error: the check runs on the run's validation data, which is not here: dataset.root={images}"
    )
    assert error.endswith("; give its folder on this machine with --data-root\n")
    assert (
        export.main([str(run_dir), "--format", "pt2", "--out", str(tmp_path / "out"), "--data-root", str(moved)]) == 0
    )
    assert "matches PyTorch" in capsys.readouterr().out


@pytest.mark.slow
def test_an_export_that_differs_from_the_model_is_one_line_a_rejected_file_and_exit_1(
    single_run, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(export, "save_pt2", lambda program, trained, path: path.write_bytes(b"pt2"))
    monkeypatch.setattr(export, "exported_program", lambda trained: None)
    model = load(single_run).model
    monkeypatch.setattr(export, "load_pt2", lambda path: lambda x: model(x) + 1e-3)
    assert export.main([str(single_run), "--format", "pt2", "--out", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"error: {tmp_path / 'model.pt2.rejected'}: validation batch 1")
    assert "logits differ from PyTorch's by up to 0.001" in error
    assert (tmp_path / "model.pt2.rejected").exists() and not (tmp_path / "model.pt2").exists()


def test_a_top1_that_differs_fails_the_check_even_within_the_tolerance():
    model = torch.nn.Linear(2, 2, bias=False).eval()
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
    x = torch.tensor([[1.0, 1.0 - 1e-6]])  # logits a millionth apart: swapped, they are still within 1e-4
    with pytest.raises(export.ExportMismatch, match="top-1 differs from PyTorch's for 1 of 1 images"):
        export.check(model, lambda batch: batch.flip(1), [x])
    assert "logits within" in export.check(model, model, [x])


def test_each_dataset_names_its_classes_by_label(tmp_path):
    from data import DATASETS, class_names

    for split, classes in (("train", ["cat", "dog"]), ("val", ["cat", "dog"])):
        for name in classes:
            (tmp_path / split / name).mkdir(parents=True)
    names = {
        dataset: class_names(DatasetConfig(name=dataset, channels=1, image_size=8, num_classes=10, root=str(tmp_path)))
        for dataset in DATASETS
    }
    assert names["cifar10"][:3] == ["airplane", "automobile", "bird"] and names["imagefolder"] == ["cat", "dog"]
    assert names["fashion_mnist"][0] == "T-shirt/top" and names["kmnist"][0] == "o" and names["mnist"][0] == "0 - zero"
    assert names["digits"] == names["synthetic"] == [str(label) for label in range(10)]  # synthetic: the labels


def test_predict_cuts_an_image_folders_files_as_the_runs_validation_does(tmp_path):
    """The run's own validation batches (data/'s loaders, as export.py checks on them) against
    predict.py's cut of the same files: the same probabilities, for JPEGs resized then centre-cropped."""
    import argparse

    from models.simple_cnn import SimpleCNN
    from tests.dataset_files import write_image_folder

    root = write_image_folder(tmp_path / "folder", size=40, suffix=".jpg")
    dataset = DatasetConfig(
        name="imagefolder", channels=3, image_size=16, num_classes=2, root=str(root), val_resize=20, val_crop=16,
        mean=[0.5, 0.4, 0.3], std=[0.2, 0.25, 0.3],
    )  # fmt: skip
    torch.manual_seed(0)
    model = SimpleCNN(in_channels=3, num_classes=2, image_size=16).eval()
    trained = Trained(tmp_path, tmp_path, dataset, DataConfig(), {"batch_size": 8}, model, "model", ["a", "b"], None)
    (batch,) = export.validation_batches(trained, 1)
    paths = image_paths([str(root / "val")])
    for precision in ("32", "bf16-mixed"):  # bf16-mixed: validation's autocast, the figures it computed
        with torch.no_grad(), Precision.of(precision, torch.device("cpu")).autocast():
            expected = model(batch).float().softmax(1)
        args = argparse.Namespace(top_k=2, batch_size=3, num_workers=0, precision=precision)
        rows, unread = predict.predict(trained, paths, torch.device("cpu"), args)
        assert unread == 0 and [path for path, _ in rows] == paths
        for (_, top), probabilities in zip(rows, expected):
            got = {label: p for label, _, p in top}
            assert got == pytest.approx(dict(enumerate(probabilities.tolist())), abs=1e-6), precision


def test_predict_computes_as_the_run_validated_unless_told_otherwise(single_run, images, tmp_path, capsys):
    checkpoint = torch.load(single_run / "checkpoints" / "best.pt", weights_only=True)
    assert "\n  precision: '32'\n" in checkpoint["config"]  # the resolved config, as YAML
    checkpoint["config"] = checkpoint["config"].replace("\n  precision: '32'\n", "\n  precision: bf16-mixed\n")
    torch.save(checkpoint, tmp_path / "bf16.pt")
    for told, computed in [([], "bf16-mixed"), (["--precision", "32"], "32")]:
        assert (
            predict.main(
                [str(tmp_path / "bf16.pt"), str(images / "digit0.png"), "--out", str(tmp_path / "p.csv"), *told]
            )
            == 0
        )
        assert capsys.readouterr().out.rstrip().endswith(f"(model weights, precision {computed}): {tmp_path / 'p.csv'}")


@pytest.mark.slow
def test_vit_tiny_exports_with_a_dynamic_batch():
    from config.schema import DataConfig
    from models.vit_tiny import TinyViT
    from trained import Trained

    model = TinyViT(in_channels=3, num_classes=10, image_size=32).eval()
    dataset = DatasetConfig(name="synthetic", channels=3, image_size=32, num_classes=10)
    program = export.exported_program(Trained(ROOT, ROOT, dataset, DataConfig(), {}, model, "model", [], None))
    x = torch.randn(3, 3, 32, 32)  # traced at 2
    with torch.no_grad():
        assert torch.allclose(program.module()(x), model(x), atol=1e-5)


@pytest.mark.slow
def test_a_model_torch_export_cannot_trace_is_one_line_and_exit_1(single_run, tmp_path, monkeypatch, capsys):
    def untraceable(trained):
        raise RuntimeError("Constraints violated (batch)!\nthe rest of torch's advice")

    monkeypatch.setattr(export, "exported_program", untraceable)
    assert export.main([str(single_run), "--format", "pt2", "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"error: torch.export cannot trace {single_run / 'checkpoints' / 'best.pt'}'s model with a dynamic batch "
        "(Constraints violated (batch)!)\n"
    )


# Fine-tuning from a run: trainer.init_from (docs/using.md).
SYNTHETIC_DIGITS = ["dataset=synthetic", "dataset.channels=1", "dataset.image_size=8", "dataset.num_classes=4"]


def test_init_from_loads_a_runs_best_weights_and_keeps_a_head_for_other_classes_fresh(single_run):
    from models.mnist_net import MnistNet

    best = single_run / "checkpoints" / "best.pt"
    checkpoint = torch.load(best, weights_only=True)
    chosen = best_weights(checkpoint)
    state = checkpoint["model"] if chosen == "model" else _ema_weights(checkpoint["ema"])
    net = MnistNet(in_channels=1, num_classes=10, image_size=8)
    assert start_from(net, str(single_run)) == (best, chosen, [])
    assert all(torch.equal(net.state_dict()[key], tensor) for key, tensor in state.items())
    torch.manual_seed(0)
    four = MnistNet(in_channels=1, num_classes=4, image_size=8)
    fresh = {key: tensor.clone() for key, tensor in four.state_dict().items()}
    _, _, kept = start_from(four, str(best))
    assert kept == ["fc2.weight", "fc2.bias"]
    for key, tensor in four.state_dict().items():
        assert torch.equal(tensor, fresh[key] if key in kept else state[key]), key


@pytest.mark.slow
def test_a_ddp_run_fine_tunes_from_an_fsdp_runs_sharded_last_pt_and_its_resume_reads_it_not(fsdp_reference, tmp_path):
    sharded_last = fsdp_reference / "checkpoints" / "last.pt"
    job = ["debug=ddp_cpu", *SYNTHETIC_DIGITS, f"trainer.init_from={sharded_last}"]
    result = run_train(tmp_path / "run", *job)
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "run" / "train.log").read_text()
    assert f"weights from {sharded_last} (its model's)" in log
    assert "trainer.init_from: fc2.weight, fc2.bias kept fresh" in log
    again = run_train(tmp_path / "run", *job, "trainer.resume=auto")
    assert again.returncode == 0, again.stderr
    log = (tmp_path / "run" / "train.log").read_text()
    said = f"trainer.init_from={sharded_last} not read: the run continues from {tmp_path / 'run' / 'checkpoints' / 'last.pt'}"
    assert said in log and log.count("weights from") == 1


@pytest.mark.slow
def test_test_only_scores_init_froms_weights_as_a_resume_of_the_same_checkpoint_scores_them(
    single_run, fsdp_reference, tmp_path
):
    """Single's best.pt (its best weights the EMA's or the model's) and FSDP's sharded last.pt."""
    for source in (single_run / "checkpoints" / "best.pt", fsdp_reference / "checkpoints" / "last.pt"):
        scored = {}
        for key in ("init_from", "resume"):
            run_dir = tmp_path / source.parent.parent.name / key
            result = run_train(run_dir, "debug=fdr", "trainer.test_only=true", f"trainer.{key}={source}")
            assert result.returncode == 0, result.stderr
            scored[key] = json.loads((run_dir / "metrics.json").read_text())
        chosen = "ema" if scored["init_from"]["weights"].endswith("its ema's") else "model"
        assert scored["init_from"]["weights"] == f"{source}, its {chosen}'s"
        own = "val_ema_acc" if chosen == "ema" else "val_acc"
        assert scored["init_from"]["val_acc"] == scored["resume"][own], source


INIT_FROM_REFUSED = {
    "no such run": (["trainer.init_from={tmp}/nope"], ["trainer.init_from: ", "nope: no such file or run dir"]),
    "another model's run": (
        ["trainer.init_from={tmp}/other"],
        ["trainer.init_from=", "another model's (lacks fc1.bias)"],
    ),
    "model.weights beside it": (
        ["model=resnet18", "model.weights={tmp}/w.pth", "trainer.init_from={tmp}/other"],
        ["model.weights=", "trainer.init_from=", "keep one"],
    ),
}


@pytest.mark.parametrize("case", INIT_FROM_REFUSED)
def test_an_init_from_that_cannot_start_the_run_is_one_line_before_launch(case, tmp_path):
    from training.checkpoint.files import save_checkpoint

    save_checkpoint({"model": {"renamed.weight": torch.zeros(1)}}, tmp_path / "other" / "checkpoints" / "last.pt")
    overrides, words = INIT_FROM_REFUSED[case]
    with pytest.raises(ConfigError) as error:
        check_and_plan(typed_config("debug=fdr", *(o.format(tmp=tmp_path) for o in overrides)), tmp_path / "run")
    assert "\n" not in str(error.value)
    for word in words:
        assert word.format(tmp=tmp_path) in str(error.value), str(error.value)


@pytest.mark.slow
def test_train_py_with_an_init_from_that_is_not_there_is_one_line_and_exit_2(tmp_path):
    result = run_train(tmp_path / "run", "debug=fdr", f"trainer.init_from={tmp_path}/nope")
    assert result.returncode == 2 and result.stderr.strip() == (
        f"error: trainer.init_from: {tmp_path}/nope: no such file or run dir; give a run dir, or a checkpoint "
        "train.py wrote (<run dir>/checkpoints/best.pt or last.pt)"
    ), result.stderr
