"""The one exception type meant for people: train.py prints it as one line and exits 2."""


class ConfigError(Exception):
    """A bad config value or environment; the message names the key, the value and the fix."""
