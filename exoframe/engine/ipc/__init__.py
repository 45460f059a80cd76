"""What crosses a process boundary: the typed messages, the thread that sends them, and a
child process's life (its entry, its failure, its stop)."""
