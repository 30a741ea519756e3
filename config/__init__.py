"""The bottom layer: `schema` declares every key (plain dataclasses, imported everywhere); the rest
is Hydra's setup: `setup` registers the schema and the resolvers and composes, `overrides` reads
the command line's keys, `callbacks` holds Hydra's callbacks. Only these three import Hydra."""
