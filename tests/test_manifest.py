"""What a run records of itself (training/manifest.py), with the secrets of its command line hidden
(config/redact.py), and bench.report's columns from it. The records that real runs leave: test_using.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from bench import report
from config.redact import redact, redacted, shown_secret
from distributed.context import DistContext
from tests.configs import job_config
from tests.runs import PASSWORD, SECRET_ROOT
from training.manifest import DIFF, MANIFEST, git_state, read_manifest, record, start, write


@pytest.mark.parametrize(
    "text, shown",
    [
        ("logger.mlflow.tracking_uri=postgresql://user:pw@db:5432/runs", "postgresql://user:***@db:5432/runs"),
        ("dataset.root=https://me:p@ss@host/data", "dataset.root=https://me:***@host/data"),
        ("+model.api_key=abc123", "+model.api_key=***"),
        ("db_password=pw other=1", "db_password=*** other=1"),
        ("HF_TOKEN=pw", "HF_TOKEN=***"),
        ("  client_secret: pw\n  lr: 0.1", "  client_secret: ***\n  lr: 0.1"),
        ('{"access_key": "pw", "x": 1}', '{"access_key": "***", "x": 1}'),
        ("uri: https://host/q?token=pw&page=2", "uri: https://host/q?token=***&page=2"),
        # Hydra's sweep and list values, whole: each item is a secret (pw2 was shown)
        ("-m logger.mlflow.password=pw1,pw2 lr=1", "-m logger.mlflow.password=*** lr=1"),
        ("+model.api_key=[pw1,pw2]", "+model.api_key=***"),
        ("x=[token=pw1,pw2]", "x=[token=***]"),  # pw1 and pw2 were shown
        ("{password: pw, user: me}", "{password: ***, user: me}"),  # a flow mapping's next key stays
    ],
)
def test_a_urls_password_and_a_secrets_value_are_hidden(text, shown):
    assert shown in redact(text) and "pw" not in redact(text).replace("pw=", "")


@pytest.mark.parametrize(
    "text",
    ["tokenizer=bert", "num_tokens: 5", "http://host:8080/path", "sqlite:///runs.db", "user@host:/data", "lr=0.1"],
)
def test_what_is_no_secret_is_left_as_it_is(text):
    assert redact(text) == text


def test_a_secret_keys_value_is_hidden_whole_in_a_structure():
    assert redacted({"model": {"api_key": 5, "root": "s3://a:pw@b/c"}, "argv": ["token=pw"]}) == {
        "model": {"api_key": "***", "root": "s3://a:***@b/c"},
        "argv": ["token=***"],
    }


@pytest.mark.parametrize(
    ("config", "shown"),
    [
        ({"dataset": {"root": "https://u:pw@h/d", "val_fraction": 0.1}}, "dataset.root=https://u:***@h/d"),
        ({"logger": {"wandb": {"mode": "online", "api_key": "${oc.env:KEY}"}}}, "logger.wandb.api_key=***"),
        (
            {"hydra": {"launcher": {"setup": ["module load cuda", "export HF_TOKEN=pw"]}}},
            "hydra.launcher.setup[1]=export HF_TOKEN=***",
        ),
        ({"model": {"api_key": None, "token_dim": 3, "use_token": True, "root": "s3://b/c"}}, None),
    ],
)
def test_a_config_shows_a_secret_where_its_records_would(config, shown):
    assert shown_secret(config) == shown


def test_a_password_on_the_command_line_reaches_no_record_the_worker_is_given(tmp_path, monkeypatch):
    uri = f"postgresql://user:{PASSWORD}@db/runs"
    overrides = (f"dataset.root={SECRET_ROOT}", "logger=mlflow", f"logger.mlflow.tracking_uri={uri}")
    monkeypatch.setattr(sys, "argv", ["train.py", *overrides])
    job = job_config(tmp_path, *overrides)
    manifest, _ = record(job, [{"host": "h", "device": "cpu"}])
    for what in (job.config_yaml, job.swept, job.hparams, manifest):  # the checkpoint's config, the loggers', ...
        assert PASSWORD not in str(what)
    assert "postgresql://user:***@db/runs" in job.config_yaml and "logger.mlflow.tracking_uri=" in manifest["command"]


def test_the_manifest_holds_the_world_the_batch_and_the_lr_trained_with(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py", "trainer.devices=2"])
    job = job_config(tmp_path, "trainer.devices=2", "optimizer.lr_scaling=linear", "trainer.accumulate_grad_batches=2")
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- trainer.devices=2\n- optimizer.lr_scaling=linear\n")
    ranks = [{"host": "a", "device": "cpu"}, {"host": "b", "device": "cpu"}]
    manifest, _ = record(job, ranks)
    assert manifest["hosts"] == ["a", "b"] and manifest["ranks"] == ranks and manifest["world_size"] == 2
    assert (manifest["global_batch"], manifest["batch_per_rank"], manifest["accumulate_grad_batches"]) == (64, 32, 2)
    assert manifest["lr"] == pytest.approx(0.05 * 64 * 2 / 256)  # optimizer.lr_scaling=linear's
    assert manifest["overrides"] == ["trainer.devices=2", "optimizer.lr_scaling=linear"]  # as Hydra recorded them
    assert manifest["command"] == "train.py trainer.devices=2"
    assert manifest["class_names"] == [str(digit) for digit in range(10)]
    assert manifest["python"].count(".") == 2 and isinstance(manifest["torch"], str) and manifest["hydra"]
    assert set(manifest) >= {"commit", "dirty", "diff", "cuda", "cudnn", "nccl", "torchvision"}
    json.dumps(manifest)  # plain values: a checkpoint loads it with weights_only=True


def _git(repo, *args):
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True, capture_output=True
    )


def test_the_commit_and_whether_the_tree_was_dirty_with_its_diff(tmp_path):
    assert git_state(tmp_path) == ({"commit": None, "dirty": None, "diff": None, "untracked": []}, "")
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "a")
    state, diff = git_state(tmp_path)
    assert len(state["commit"]) == 40 and (state["dirty"], state["diff"], state["untracked"], diff) == (
        False,
        None,
        [],
        "",
    )
    (tmp_path / "a.py").write_text("x = 2\n")
    state, diff = git_state(tmp_path)
    assert (state["dirty"], state["diff"]) == (True, DIFF) and "-x = 1\n+x = 2" in diff
    _git(tmp_path, "checkout", "a.py")
    (tmp_path / "new.py").write_text("")
    state, diff = git_state(tmp_path)
    assert (state["dirty"], state["diff"], state["untracked"], diff) == (True, None, ["new.py"], "")


def test_a_key_in_the_trees_diff_reaches_no_record(tmp_path, monkeypatch):
    # A job script edited to export a key (as docs/using.md asks: keys through the environment) lay
    # in plain text in the run dir's manifest.diff.
    code = tmp_path / "code"
    code.mkdir()
    _git(code, "init", "-q")
    (code / "train.sbatch").write_text("set -euo pipefail\n")
    _git(code, "add", "train.sbatch")
    _git(code, "commit", "-q", "-m", "a")
    (code / "train.sbatch").write_text(f"set -euo pipefail\nexport WANDB_API_KEY={PASSWORD}\nDATA={SECRET_ROOT}\n")
    monkeypatch.setattr("training.manifest._CODE", code)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    run_dir = tmp_path / "run"
    written = start(DistContext(0, 0, 1, 1, torch.device("cpu"), None), job_config(run_dir))
    assert (written["dirty"], written["diff"]) == (True, DIFF)
    diff = (run_dir / DIFF).read_text()
    assert PASSWORD not in diff
    assert "+export WANDB_API_KEY=***\n+DATA=https://user:***@example.org/data\n" in diff


def test_the_diff_lies_beside_the_manifest_while_the_tree_is_dirty(tmp_path):
    write(tmp_path, {"commit": "c"}, "+x\n")
    assert read_manifest(tmp_path) == {"commit": "c"} and (tmp_path / DIFF).read_text() == "+x\n"
    write(tmp_path, {"commit": "d"}, "")  # a resume from a clean tree: the earlier diff is not its
    assert read_manifest(tmp_path) == {"commit": "d"} and not (tmp_path / DIFF).exists()
    (tmp_path / MANIFEST).write_text("{")
    assert read_manifest(tmp_path) is None and read_manifest(tmp_path / "none") is None


def test_bench_report_shows_each_runs_commit_and_torch_where_runs_have_a_manifest(tmp_path):
    for name, manifest in [("a", {"commit": "0123456789abcdef", "dirty": True, "torch": "2.14.1"}), ("b", None)]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(
            json.dumps({"val_acc": 0.9, "train_samples_per_s": 1.0, "model": "m", "dataset": "d"})
        )
        if manifest:
            write(tmp_path / name, manifest, "")
    header, _, a, b = report.markdown(report.rows(report.load_runs(tmp_path))).splitlines()
    assert header.endswith("| commit | torch | run |")
    assert a.endswith("| 012345678+ | 2.14.1 | a |") and b.endswith("| — | — | b |")
    alone = report.markdown(report.rows(report.load_runs(tmp_path / "b")))
    assert "commit" not in alone  # no run with a manifest: no columns for it


def test_the_resume_command_a_preempted_run_logs_hides_a_password():
    from training.preemption import resume_command

    command = resume_command(["strategy=ddp", f"dataset.root={SECRET_ROOT}"], "/runs/r")
    assert command == "python train.py strategy=ddp dataset.root=https://user:***@example.org/data " + (
        "hydra.run.dir=/runs/r trainer.resume=auto"
    )
