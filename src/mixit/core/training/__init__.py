"""Training: the step, the optimizer and schedule, evaluation, and the loop."""
