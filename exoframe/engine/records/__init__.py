"""What a run keeps on disk: the run folder, its lock, checkpoints and each rank's state."""
