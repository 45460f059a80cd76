"""What runs in a node: the rank's training loop, its data, its host (a process of its own
or a greenlet of a worker: packing.py), and the models it sends for validation."""
