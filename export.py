"""Export a trained run's model for use without this repo: python export.py <run dir or checkpoint> [options].

Writes <out>/model.pt2 (torch.export: load it with torch.export.load(path).module()) and
<out>/model.onnx (torch's dynamo ONNX exporter), both with a dynamic batch dimension, both
carrying the class names and the input's normalisation (ONNX: metadata_props; .pt2: the extra
file metadata.json). Each file is checked once written: on the first validation batches of the
run's own dataset config (its files must be here: at its dataset.root, or where --data-root says),
the exported model's logits (ONNX Runtime's; the reloaded .pt2's) match PyTorch's to 1e-4
(absolute and relative), and top-1 agrees. A file that fails is renamed <name>.rejected, said in
one line, and the exit status is 1.

Exit status: 0, every file written and checked; 1, a check failed, or torch could not export the
model (in one line); 2, a run that is not one, its validation data missing, a missing tool
(pip install -r requirements-extras.txt) or an --out it cannot write, in one line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from config.paths import make_folder
from errors import ConfigError, first_line
from trained import Trained, load, metadata, source_parser

FORMATS = ("pt2", "onnx")
TOLERANCE = 1e-4  # absolute and relative, on the logits
METADATA = "metadata.json"  # the .pt2's extra file


class ExportMismatch(Exception):
    """An exported model that does not compute what the trained one does."""


def parser() -> argparse.ArgumentParser:
    parse = source_parser("python export.py", __doc__)
    parse.add_argument("--out", type=Path, default=None, help="the folder to write to (default <run dir>/export)")
    parse.add_argument("--format", nargs="+", choices=FORMATS, default=list(FORMATS), help="default: both")
    parse.add_argument("--check-batches", type=int, default=2, help="validation batches to check on (default 2)")
    parse.add_argument(
        "--data-root",
        type=Path,
        default=None,
        help="where the run's dataset is on this machine (default: its dataset.root)",
    )
    return parse


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.check_batches < 1:
            raise ConfigError(f"--check-batches={args.check_batches}: check on 1 or more validation batches")
        if "onnx" in args.format:
            _require_onnx()
        trained = load(args.source, args.weights)
        if args.data_root is not None:
            trained = replace(trained, dataset=replace(trained.dataset, root=str(args.data_root)))
        out = args.out or trained.run_dir / "export"
        make_folder(out, f"--out={out}")
        try:
            batches = validation_batches(trained, args.check_batches)
        except ConfigError as e:
            raise ConfigError(
                f"the check runs on the run's validation data, which is not here: {e}; give its folder on this machine "
                "with --data-root"
            ) from None
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        program = exported_program(trained)
    except Exception as e:  # torch.export's many kinds: a branch on a value, a batch size baked in
        reason = first_line(e)
        print(
            f"error: torch.export cannot trace {trained.path}'s model with a dynamic batch ({reason})", file=sys.stderr
        )
        return 1
    written = [write_and_check(kind, program, trained, batches, out / f"model.{kind}") for kind in args.format]
    return 0 if all(written) else 1


def write_and_check(
    kind: str, program: torch.export.ExportedProgram, trained: Trained, batches: list[torch.Tensor], path: Path
) -> bool:
    """`path` written (through a temp file) and checked, what the check found said in a line; a file
    the check refuses renamed <name>.rejected, and that said in one line on stderr."""
    tmp = path.with_name(f".{path.stem}.tmp.{kind}")  # torch.export.load wants its suffix
    try:
        (save_pt2 if kind == "pt2" else save_onnx)(program, trained, tmp)
    except Exception as e:  # an operator the ONNX exporter lacks, ...
        tmp.unlink(missing_ok=True)
        print(f"error: {path}: not written, the {kind} export failed ({first_line(e)})", file=sys.stderr)
        return False
    try:
        figures = check(trained.model, (load_pt2 if kind == "pt2" else load_onnx)(tmp), batches)
    except ExportMismatch as e:
        rejected = path.with_name(f"{path.name}.rejected")
        os.replace(tmp, rejected)
        kept = f"the export is not the trained model, so it is not kept as {path.name}"
        print(f"error: {rejected}: {e}; {kept}", file=sys.stderr)
        return False
    os.replace(tmp, path)
    print(f"{path}: {figures}")
    return True


def _require_onnx() -> None:
    import importlib.util

    missing = [name for name in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"--format onnx needs {', '.join(missing)}: pip install -r requirements-extras.txt, or --format pt2"
        )


def validation_batches(trained: Trained, count: int) -> list[torch.Tensor]:
    """The first `count` validation batches of the run's own dataset config, as training's validation
    fed them to the model (normalised), on the CPU: built through data/, nothing downloaded."""
    from data import Loaders, build_loaders
    from distributed.context import DistContext

    cpu = torch.device("cpu")
    settings = trained.trainer
    batch = settings.get("val_batch_size") or settings.get("batch_size") or 64
    data = replace(trained.data, num_workers=0, persistent_workers=False, pin_memory=False)
    dataset = replace(trained.dataset, download=False)  # the files must be here: a check never fetches them
    loaders = build_loaders(dataset, data, DistContext(0, 0, 1, 1, cpu, None), batch, settings.get("seed", 0))
    batches = []
    for x, y in loaders.val:
        batches.append(Loaders.to_device(loaders.val, x, y, cpu)[0])
        if len(batches) == count:
            break
    return batches


def exported_program(trained: Trained) -> torch.export.ExportedProgram:
    """The model in eval mode traced by torch.export at a batch of 2, the batch dimension left dynamic."""
    dataset = trained.dataset
    size = dataset.val_crop or dataset.image_size
    example = torch.zeros(2, dataset.channels, size, size)
    batch = torch.export.Dim("batch", min=1)
    return torch.export.export(trained.model, (example,), dynamic_shapes=({0: batch},))


def save_pt2(program: torch.export.ExportedProgram, trained: Trained, path: Path) -> None:
    torch.export.save(program, path, extra_files={METADATA: json.dumps(metadata(trained))})


def load_pt2(path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    module = torch.export.load(path).module()
    return lambda x: module(x)


def save_onnx(program: torch.export.ExportedProgram, trained: Trained, path: Path) -> None:
    """Through torch's dynamo exporter (from the very program the .pt2 holds); the metadata as
    metadata_props, each value a string (JSON where it is a list)."""
    onnx_program = torch.onnx.export(
        program,
        dynamo=True,
        input_names=["images"],
        output_names=["logits"],
        dynamic_shapes=({0: "batch"},),  # the program's dimension, named for the file's readers
        verbose=False,
    )
    for key, value in metadata(trained).items():
        onnx_program.model.metadata_props[key] = value if isinstance(value, str) else json.dumps(value)
    onnx_program.save(str(path))


def load_onnx(path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda x: torch.from_numpy(session.run(None, {"images": x.numpy()})[0])


def check(model: torch.nn.Module, exported: Callable[[torch.Tensor], torch.Tensor], batches: list[torch.Tensor]) -> str:
    """The exported model against the trained one on each batch, and on the first cut to one image
    (the batch dimension is dynamic): logits to TOLERANCE, the same top-1. What it found, in words;
    ExportMismatch naming the batch and the figure where it differs."""
    cases = [*batches, batches[0][:1]]
    worst = 0.0
    with torch.inference_mode():
        for number, x in enumerate(cases, start=1):
            expected, got = model(x).float(), exported(x).float()
            which = f"validation batch {number}" if number <= len(batches) else "one image alone"
            if got.shape != expected.shape:
                raise ExportMismatch(f"{which}: logits of shape {tuple(got.shape)}, not {tuple(expected.shape)}")
            error = (got - expected).abs()
            allowed = TOLERANCE + TOLERANCE * expected.abs()
            if (error > allowed).any():
                raise ExportMismatch(
                    f"{which}: logits differ from PyTorch's by up to {error.max().item():.3g} "
                    f"(allowed {TOLERANCE:g} absolute and relative)"
                )
            differs = (got.argmax(1) != expected.argmax(1)).sum().item()
            if differs:
                raise ExportMismatch(f"{which}: top-1 differs from PyTorch's for {differs} of {len(x)} images")
            worst = max(worst, error.max().item())
    images = sum(len(x) for x in batches)
    return (
        f"matches PyTorch on {len(batches)} validation batch(es) of {images} images and on one alone: "
        f"logits within {worst:.2g}, top-1 the same"
    )


if __name__ == "__main__":
    sys.exit(main())
