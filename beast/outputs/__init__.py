"""What a run leaves behind: logs, W&B, checkpoints, plots, evaluation records."""
