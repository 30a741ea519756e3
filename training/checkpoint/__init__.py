"""Checkpoints: everything needed to continue a run as if it had never stopped, written atomically by
rank 0 (or, under strategy=fsdp, sharded by every rank and committed by rank 0); tensors and
primitives only, loadable with weights_only=True.

- `files`: the atomic write, the guarded read, the config a checkpoint carries;
- `state`: the train state and the random streams, as every checkpoint form holds them;
- `resume`: which checkpoint a run continues, decided once before launch and agreed on by every rank;
- `checkpointer`: saving and restoring a run (`Checkpointer`);
- `sharded`: strategy=fsdp's form of last.pt, through torch.distributed.checkpoint: written, read, described;
- `sharded_checkpointer`: strategy=fsdp's saving and restoring (`ShardedCheckpointer`), on that form.
- `weights`: a trained run's weights, read to use them (predict.py, export.py, trainer.init_from).
"""
