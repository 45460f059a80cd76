"""A network file as a real network on this machine (root, Linux): a namespace per rank,
links shaped with tc, the delay line (delayline.c) for round trips, jitter and loss; a job
run there and in the simulator side by side (`exoframe emulate`, runner.py)."""
