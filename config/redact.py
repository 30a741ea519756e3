"""Secrets out of what a run records: a URL's password (postgresql://user:secret@host/db) and the
value of a key named as a secret (api_key=..., password: ..., ?token=...), as `***`. For whatever
holds the command line or the config: the manifest, the config a checkpoint carries, the
loggers' options; and where the records would show one, which is refused (`shown_secret`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

HIDDEN = "***"
# Where a refused secret goes instead: every backend here reads its own from the environment.
IN_THE_ENVIRONMENT = (
    "give it through the environment instead "
    "(PGPASSWORD or ~/.pgpass for a database, MLFLOW_TRACKING_PASSWORD, WANDB_API_KEY)"
)
# A key named as a secret: it ends in one of these words (db_password, HF_TOKEN, openai-api-key,
# client_secret, githubtoken), not in a longer one (tokenizer, num_tokens).
_SECRET_KEY = r"[\w.-]*?(?:password|passwd|secret|token|apikey|credentials?|(?:api|access|private|secret)[_-]?key)"
# scheme://user:password@host: the password, up to the last @ before the path.
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][\w+.-]*://[^/\s:@]*:)[^\s/]*(@)")
# key=value (an override, a URL's query), key: value (YAML), "key": "value" (JSON): the value. Whole
# as Hydra reads it, a sweep (pw1,pw2) or a list ([pw1,pw2]) included; a comma with a space after
# it ends a flow mapping's value ({password: pw, user: me}).
_KEY_VALUE = re.compile(
    rf"""((?:^|(?<=[\s,{{?&;'"+~\[(]))["']?{_SECRET_KEY}["']?\s*(?:=|:\s)\s*)"""
    r"""("[^"]*"|'[^']*'|\[[^\]]*\]|(?:[^\s&,;}\]]|,(?=[^\s,]))+)""",
    re.IGNORECASE | re.MULTILINE,
)


def is_secret_key(key: str) -> bool:
    """Whether a key (its last part: logger.mlflow.api_key) names a secret."""
    return re.fullmatch(_SECRET_KEY, key.rsplit(".", 1)[-1], re.IGNORECASE) is not None


def redact(text: str) -> str:
    """`text` with every password of a URL and every value of a secret's key replaced by ***."""
    text = _URL_PASSWORD.sub(rf"\g<1>{HIDDEN}\g<2>", text)
    return _KEY_VALUE.sub(_hidden, text)


def _hidden(match: re.Match) -> str:
    value = match.group(2)
    quote = value[0] if value[0] in "'\"" else ""
    return f"{match.group(1)}{quote}{HIDDEN}{quote}"


def redacted(value: Any, key: str = "") -> Any:
    """A value of the command line or the config, strings redacted, dicts and lists walked; the whole
    value of a secret's key hidden."""
    if key and is_secret_key(key):
        return HIDDEN
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: redacted(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redacted(v) for v in value)
    return value


def shown_secret(value: Any, path: str = "") -> str | None:
    """The first `key=value` of a config (dicts and lists, as its files wrote it) that shows a
    secret, the secret hidden; None when none does. An interpolation counts as what it names: its
    value would reach the records that resolve the config. A secret's key set to nothing, or to a
    switch (use_token: true), shows none."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            key = f"{path}.{k}" if path else str(k)
            if v not in (None, "") and not isinstance(v, bool) and is_secret_key(str(k)):
                return f"{key}={HIDDEN}"
            if (found := shown_secret(v, key)) is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if (found := shown_secret(v, f"{path}[{i}]")) is not None:
                return found
    elif isinstance(value, str) and redact(value) != value:
        return f"{path}={redact(value)}"
    return None
