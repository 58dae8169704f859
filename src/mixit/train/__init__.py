"""Training: the loop, the optimizer and schedule, evaluation, checkpoints."""
