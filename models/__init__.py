"""Networks as plain nn.Modules. Nothing here knows about processes or devices; conf/model/
names one by its `_target_`, and the pre-flight (preflight.py) turns that into a factory each
rank calls."""
