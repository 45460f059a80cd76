"""A thread that writes a process's outgoing messages in order, so that the process never
blocks in a send while its peer blocks in one to it, or waits for a busy reader."""
from __future__ import annotations

import queue
import threading
from multiprocessing.reduction import ForkingPickler


class Sender(threading.Thread):
    """Writes every outgoing bundle in order, off the thread that flushes it (the hub's or
    the monitor's), which pickles it then: a node may change its objects once it runs
    again (a node gives way at each step it sends its state; its other messages hold
    values)."""

    def __init__(self):
        super().__init__(daemon=True, name="exoframe-sender")
        self.queue: queue.Queue = queue.Queue()

    def run(self):
        while (item := self.queue.get()) is not None:
            conn, data = item
            try:
                conn.send_bytes(data)
            except OSError:
                pass  # the peer is gone: the launcher reports why

    def sender_for(self, conn):
        return lambda message: self.queue.put((conn, ForkingPickler.dumps(message)))

    def close(self, timeout: float | None = None):
        self.queue.put(None)
        self.join(timeout)
