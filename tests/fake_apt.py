"""An apt-get for rehearsing a fresh machine's install without root: like dpkg, it refuses a second
caller while one holds its lock, and it records each update and install in $FAKE/calls."""

from __future__ import annotations

_APT_GET = """#!/bin/bash
# dpkg's frontend lock, as apt-get takes it: a second apt-get at once fails at once.
exec 9>"$FAKE/dpkg.lock"
flock -n 9 || { echo "E: Could not get lock $FAKE/dpkg.lock. It is held by another process" >&2; exit 100; }
sleep 0.3
if [[ " $* " == *" update "* ]]; then echo update >> "$FAKE/calls"; fi
if [[ " $* " == *" install "* ]]; then
  echo install >> "$FAKE/calls"
INSTALLS
fi
"""


def fake_apt_get(installs: str) -> str:
    """The script; `installs`: the shell lines that put the installed programs in place."""
    return _APT_GET.replace("INSTALLS\n", installs)
