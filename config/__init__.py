"""The edge between Hydra and the code: `schema` declares every key (plain dataclasses, imported
everywhere); `setup` registers it with Hydra and composes; `check` turns a composed config into a
launch plan and a typed `RunConfig`. Only `setup` and `check` import Hydra or OmegaConf."""
