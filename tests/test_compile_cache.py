"""trainer.compile's cache in the sweep or run dir (training/compile_cache.py), unless the user named one."""

from __future__ import annotations

import pytest
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from tests import train_server
from training.compile_cache import use_compile_cache


def test_the_cache_goes_to_the_given_dir_unless_the_user_chose_one(tmp_path):
    for env in ({}, {"TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}):  # the latter: torch._dynamo's import set it
        use_compile_cache(tmp_path / "sweep", env)
        assert env == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "sweep" / "inductor_cache")}
    chosen = {"TORCHINDUCTOR_CACHE_DIR": "/scratch/kernels"}
    use_compile_cache(tmp_path / "sweep", chosen)
    assert chosen == {"TORCHINDUCTOR_CACHE_DIR": "/scratch/kernels"}


@pytest.mark.slow
def test_train_py_sets_a_compiled_runs_cache_before_its_pre_flight(tmp_path, monkeypatch):
    """A run's own dir, a sweep's dir for its jobs; said before the pre-flight, which then refuses
    the run: nothing compiles, nothing waits for a compiler."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    refused = ["trainer.compile=true", "trainer.gpus=64", "trainer.progress_bar=false"]  # more than any machine has
    run = train_server.run([f"hydra.run.dir={tmp_path / 'run'}", *refused])
    sweep = train_server.run(["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", *refused])
    for done, where in [(run, tmp_path / "run"), (sweep, tmp_path / "sweep")]:
        assert done.returncode == 2 and "error: trainer.gpus=64" in done.stderr, done.stderr
        assert f"torch.compile's cache: {where / 'inductor_cache'} (TORCHINDUCTOR_CACHE_DIR)" in done.stdout
