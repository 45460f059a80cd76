"""A thread that writes a process's outgoing messages in order, so that the process never
blocks in a send while its peer blocks in one to it, or waits for a busy reader."""
from __future__ import annotations

import queue
import threading
from multiprocessing.reduction import ForkingPickler

from .messages import Bundle


class Sender(threading.Thread):
    """Writes every outgoing message in order, off the thread that sends it (a hub's, the
    monitor's, a rank's), which pickles it then: what it refers to may change once that
    thread goes on (a node's objects, a rank's models)."""

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


class Outbox:
    """Messages for one pipe, sent as one Bundle at flush() by send(bundle)."""

    def __init__(self, conn, send):
        self.conn, self.pending, self._send = conn, [], send

    def flush(self):
        if self.pending:
            bundle, self.pending = Bundle(tuple(self.pending)), []
            self._send(bundle)
