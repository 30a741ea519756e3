"""The training loop and everything rank 0 writes: logs, TensorBoard, metrics, checkpoints."""
