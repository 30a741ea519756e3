"""model.arch: the one-line answer to a name torchvision lacks, with the closest names it has."""

from __future__ import annotations

import difflib

from errors import ConfigError


def unknown_arch(arch: str, names: list[str], kind: str, otherwise: str) -> ConfigError:
    """`otherwise`: the hint when no name is close (a misspelling usually is)."""
    closest = difflib.get_close_matches(arch, names, n=3, cutoff=0.5)
    hint = f"closest: {', '.join(closest)}" if closest else otherwise
    return ConfigError(f"model.arch={arch}: torchvision has no such {kind}; {hint}")
