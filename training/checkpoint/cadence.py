"""When last.pt is saved between validations: the Trainer asks `due(step)` after each optimizer step
(each validation's end saves anyway, and so does a preemption)."""

from __future__ import annotations


class SaveCadence:
    """Every trainer.checkpoint_every_n_steps optimizer steps; None: at validations only. Every rank
    asks at every step and gets the same answer: a mid-epoch save takes every rank."""

    def __init__(self, every_n_steps: int | None) -> None:
        self.every_n_steps = every_n_steps

    def due(self, step: int) -> bool:
        return self.every_n_steps is not None and step % self.every_n_steps == 0
