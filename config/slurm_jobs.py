"""How a sweep's SLURM jobs ended, on a cluster that keeps no accounting (hydra/launcher=submitit_slurm).

submitit learns that a job ended from the result file the job writes as it ends, or else from sacct.
A cluster that keeps no accounting (AccountingStorageType=accounting_storage/none: many a lab's, and
slurm/rig.sh's) answers sacct with an error: a job that ended without a result (cancelled, killed for
memory or time, its node lost) was waited for forever, and the sweep with it. There squeue answers.
Imported by a sweep that submits to SLURM alone (config/callbacks.py): submitit takes a while to import.
"""

from __future__ import annotations

import re
import subprocess

from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

NO_ACCOUNTING = "accounting_storage/none"
# squeue lists a job until MinJobAge after its end (300 s by default): asked at least once a minute,
# it tells how each ended. submitit's own watcher asks sacct, which keeps jobs for good, every 10 min.
ASK_EVERY_S = 60
FORGOTTEN = "ENDED (squeue lists it no more)"


class SqueueWatcher(SlurmInfoWatcher):
    """submitit's watcher of SLURM jobs, asking squeue instead of sacct."""

    def _make_command(self) -> list[str] | None:
        if not self._registered - self._finished:
            return None
        # The user's jobs, ended ones too. Asked by id, squeue fails outright once it knows none of them.
        return ["squeue", "--me", "--states=all", "--noheader", "--format=%i|%T|%N"]

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        listed = string.decode() if isinstance(string, bytes) else string
        info = super().read_info("JobID|State|NodeList\n" + listed)  # sacct's --parsable2 form
        # squeue knew every job it was asked for once submitted: one it lists no more has ended.
        for job_id in self._registered - self._finished:
            info.setdefault(job_id, {"JobID": job_id, "State": FORGOTTEN})
        return info


def watch_with_squeue_where_no_accounting() -> bool:
    """Where this cluster keeps no accounting, submitit's SLURM jobs are watched with squeue from now
    on; whether they are."""
    try:
        shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False  # no SLURM here: submitting the first job says so
    if not re.search(rf"^AccountingStorageType\s*=\s*{NO_ACCOUNTING}\s*$", shown, re.M):
        return False
    SlurmJob.watcher = SqueueWatcher(delay_s=ASK_EVERY_S)  # the one all of submitit's SLURM jobs ask
    return True
