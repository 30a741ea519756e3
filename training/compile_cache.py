"""trainer.compile's kernels kept where a run's next attempt looks: inductor's cache (its FX graphs,
AOTAutograd's and the kernels it compiled) in the sweep dir, which a search's trials share, or in the
run dir, which a requeued or resumed run comes back to. Inductor's default, /tmp/torchinductor_<user>,
is each node's own and often wiped with the job: a trial or a requeue on another node (or after a
clean-up) would compile everything again. What that saves: BENCHMARKS.md, "Searches that scale"."""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from pathlib import Path

CACHE_DIR = "inductor_cache"
log = logging.getLogger("train")


def use_compile_cache(where: Path, env: MutableMapping[str, str] = os.environ) -> None:
    """Inductor's cache in `where` (a sweep's dir, or the run's), unless TORCHINDUCTOR_CACHE_DIR names
    another. Inductor's own default there is not a choice: importing torch._dynamo writes it into the
    environment. Set before the ranks start, which inherit it; inductor reads it as it compiles."""
    # torch 2.14.1: inductor's fallback, in its private cache_dir_utils. Imported here, not above: it
    # imports torch._dynamo (seconds), which a run that does not compile never needs.
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if env.get("TORCHINDUCTOR_CACHE_DIR", default_cache_dir()) != default_cache_dir():
        return
    env["TORCHINDUCTOR_CACHE_DIR"] = str(where.resolve() / CACHE_DIR)
    log.info("torch.compile's cache: %s (TORCHINDUCTOR_CACHE_DIR)", env["TORCHINDUCTOR_CACHE_DIR"])
