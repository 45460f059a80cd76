"""What reads a run's trace again: replays on another network, and projections to scale."""
