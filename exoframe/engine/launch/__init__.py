"""What the launcher runs while the ranks train: it forks them (hosting.py), hosts the
simulator, reads their messages into rows (monitor.py), validates (evaluator.py), watches for
stalls, and serves ranks on other machines (cluster.py)."""
