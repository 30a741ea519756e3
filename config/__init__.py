"""The bottom layer: the config from end to end. `schema` declares every key and checks its value
(plain dataclasses, imported everywhere); `typed` turns Hydra's composition into them and into the
workers' RunConfig; `launcher_env` reads what the resolvers need of torchrun's and SLURM's
environment; `redact` keeps secrets out of records; `paths` makes the folders a run or a command
writes to, or says in one line why it cannot. Hydra's setup: `setup` registers the schema and
the resolvers and composes, `overrides` reads the command line's keys, `callbacks` holds Hydra's
callbacks. Nothing here imports a layer above it."""
