"""Runs across machines under torchrun.

`torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST:PORT -m exoframe run ...`
starts one process per rank on each machine. Each reads RANK, WORLD_SIZE, LOCAL_RANK and
MASTER_ADDR/MASTER_PORT (the rendezvous's TCPStore, which torchrun's agent hosts) and
builds the whole run from the config and seed, as the launcher of a local run does (no
fork inheritance: the same seed gives the same model and data on every machine).

The process of rank 0 becomes the launcher (`Service`): it forks rank 0's training
process and the evaluator as a local run does, listens on MASTER_ADDR's address, and
publishes its port in the rendezvous store. Every other rank (`join`) connects to it over
TCP and says Hello: its rank, exoframe's version and its config, which must equal rank 0's
(else the run is refused, naming the field). From then on the launcher runs the simulator,
rows and stop verdicts for every rank over these connections, exactly as over a local
run's pipes, so the metrics and simulated clocks equal a local run's.

The connection proves the run's token both ways (exoframe/sim/clocks/transport.py): the
EXOFRAME_TOKEN environment variable, which a run across machines requires (set the same on
every machine: it never crosses the network); on one machine (the rendezvous on loopback)
rank 0 may instead make one, write it to a file only its user can read, in its private
folder, and publish that file's path in the rendezvous store (which anyone on the machine
can read). A store rank 0 serves itself listens on MASTER_ADDR only.
"""
from __future__ import annotations

import datetime
import json
import os
import select
import socket
import time

import torch.distributed as dist

from ... import __version__
from ...errors import ExoframeError
from ...sim.clocks.transport import (HANDSHAKE_SECONDS, HandshakeError, Listener, TransportError,
                                     connect, connect_raw)
from ..ipc.messages import Hello, Refused, Welcome
from ..plan.cluster_env import ClusterEnv

SERVICE_KEY = "service"


def open_store(env: ClusterEnv, timeout: float) -> dist.Store:
    """The rendezvous store, under this run's prefix. Rank 0 hosts it when torchrun's
    agent does not (ranks started by hand with the variables set)."""
    host_it = env.rank == 0 and not env.agent_store
    def unreachable(why: str) -> ExoframeError:
        return ExoframeError(
            f"rank {env.rank}: could not reach the rendezvous store: {why} (--connect-timeout): "
            "check MASTER_ADDR and MASTER_PORT (torchrun's --rdzv-endpoint) and that rank 0's "
            "machine is up.")

    if not host_it:  # say so ourselves: torch would log a C++ stack per attempt first
        try:
            connect_raw(env.master_addr, env.master_port, timeout).close()
        except TransportError as e:
            raise unreachable(str(e)) from None
    listen_fd = served_on_loopback(env) if host_it and env.is_loopback() else None
    try:
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size if host_it
                              else None, is_master=host_it, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout),
                              master_listen_fd=listen_fd)
    except (RuntimeError, TimeoutError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise unreachable(f"{env.master_addr}:{env.master_port}: {first[:200]}") from None
    return dist.PrefixStore(env.prefix, store)


def served_on_loopback(env: ClusterEnv) -> int:
    """The listening socket of the store rank 0 serves, bound to MASTER_ADDR (torch's own
    would listen on every interface), as a descriptor for TCPStore."""
    family = socket.AF_INET6 if ":" in env.master_addr else socket.AF_INET
    try:
        return socket.create_server((env.master_addr, env.master_port), family=family,
                                    backlog=128).detach()
    except OSError as e:
        raise ExoframeError(f"rank 0: cannot serve the rendezvous store on "
                            f"{env.master_addr}:{env.master_port}: {e.strerror}; give a free "
                            "MASTER_PORT.") from None


def config_difference(mine: dict, theirs: dict) -> str | None:
    """The first field where two ranks' configs differ, as 'steps=5 where rank 0 has 3'."""
    for key in sorted(set(mine) | set(theirs)):
        if mine.get(key) != theirs.get(key):
            return f"{key}={theirs.get(key)!r} where rank 0 has {key}={mine.get(key)!r}"
    return None


class Service:
    """Rank 0's side: listen, publish where, accept every other rank's Hello."""

    def __init__(self, env: ClusterEnv, timeout: float, config: dict, device: str,
                 folder: str):
        """config: the run's configuration; device: the device it resolved to here;
        folder: the launcher's private folder (mode 0700), for the token file."""
        self.env, self.timeout, self.config, self.device = env, timeout, config, device
        token = env.token()
        self.store = open_store(env, timeout)
        self.listener = Listener(env.listen_address(), token)
        published = {"port": self.listener.address[1]}
        if env.shared_token is None:
            published["token_file"] = os.path.join(folder, "token")
            fd = os.open(published["token_file"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(fd, "w") as f:
                f.write(token.hex())
        self.store.set(SERVICE_KEY, json.dumps(published))
        self.hosts = {}  # rank -> its machine, for the ranks that joined

    def accept_ranks(self) -> dict:
        """rank -> connection, for every rank but 0, once all have said Hello. On a failure
        every connection is closed: a rank waiting on it learns that the run stopped."""
        joined, deadline = {}, time.monotonic() + self.timeout
        try:
            while len(joined) < self.env.world_size - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [r for r in range(1, self.env.world_size) if r not in joined]
                    raise ExoframeError(
                        f"rank(s) {', '.join(map(str, missing))} did not join within "
                        f"{self.timeout:g} s (--connect-timeout): start every machine's "
                        "torchrun with the same command, or raise --connect-timeout.")
                if select.select([self.listener], [], [], left)[0]:
                    self._admit(self.listener.accept(), joined)
        except BaseException:
            for conn in joined.values():
                conn.close()
            raise
        finally:
            self.listener.close()  # nobody else may join: nothing listens any more
        return joined

    def _admit(self, conn, joined: dict):
        hello = _first_message(conn)
        if hello is None:
            return
        refusal = self._check(hello, joined)
        if refusal is not None:
            try:
                conn.send(Refused(refusal))
            finally:
                conn.close()
            raise ExoframeError(refusal)
        conn.send(Welcome())
        joined[hello.rank] = conn
        self.hosts[hello.rank] = hello.host

    def _check(self, hello: Hello, joined: dict) -> str | None:
        fix = "start every rank with the same command and config"
        if hello.world_size != self.env.world_size or not 0 < hello.rank < hello.world_size:
            return (f"a rank joined as rank {hello.rank} of {hello.world_size} but this run has "
                    f"{self.env.world_size} ranks: {fix}.")
        if hello.rank in joined:
            return f"two processes joined as rank {hello.rank}: {fix}."
        if hello.version != __version__:
            return (f"rank {hello.rank} on {hello.host} runs exoframe {hello.version} but rank "
                    f"0 runs {__version__}: install the same version on every machine.")
        difference = config_difference(self.config, hello.config)
        if difference is not None:
            return f"rank {hello.rank} on {hello.host} was started with {difference}: {fix}."
        if hello.device != self.device:
            return (f"rank {hello.rank} on {hello.host} resolved --device to {hello.device} "
                    f"where rank 0 has {self.device}: name the same device on every machine.")
        return None

    def close(self):
        self.listener.close()


def _first_message(conn):
    """The Hello of an accepted connection, or None (then closed) if it sends none."""
    if conn is None:
        return None
    try:
        if conn.poll(HANDSHAKE_SECONDS):
            message = conn.recv()
            if isinstance(message, Hello):
                return message
    except Exception:  # a peer with the token that sends something unreadable
        pass
    conn.close()
    return None


def read_token(env: ClusterEnv, published: dict) -> str:
    """The token rank 0 wrote to the file it published, if that file is this user's alone
    (anyone on the machine may write the store)."""
    path = published.get("token_file", "")
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW)) as f:
            info = os.fstat(f.fileno())
            if info.st_uid == os.getuid() and not info.st_mode & 0o077:
                return f.read()
        why = "not this user's alone"
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or str(e)
    raise ExoframeError(f"rank {env.rank}: cannot read the run's token from rank 0's file "
                        f"'{path}' ({why}): start every rank as the same user on this "
                        "machine, or set the same EXOFRAME_TOKEN for every rank.")


def join(env: ClusterEnv, timeout: float, config: dict, device: str):
    """Another rank's side: find rank 0's launcher, say Hello; the connection once welcome.
    config: the run's configuration; device: the device it resolved to here."""
    store = open_store(env, timeout)
    try:
        published = json.loads(store.get(SERVICE_KEY))
    except (RuntimeError, TimeoutError) as e:
        raise ExoframeError(f"rank {env.rank}: rank 0 did not open the run within {timeout:g} s "
                            "(--connect-timeout): check that rank 0 started, with the same "
                            f"command ({str(e).strip()[:200]}).") from None
    token = env.token(None if env.shared_token else read_token(env, published))
    try:
        conn = connect(env.master_addr, published["port"], token, timeout)
    except TransportError as e:
        hint = ("; set the same EXOFRAME_TOKEN on every machine"
                if isinstance(e, HandshakeError) else "")
        raise ExoframeError(f"rank {env.rank}: rank 0's launcher: {e}{hint}.") from None
    conn.send(Hello(env.rank, env.world_size, socket.gethostname(), __version__, config, device))
    try:
        reply = conn.recv() if conn.poll(timeout) else None
    except (EOFError, OSError):
        reply = None
    if isinstance(reply, Refused):
        raise ExoframeError(reply.message)
    if not isinstance(reply, Welcome):
        raise ExoframeError(f"rank {env.rank}: rank 0's launcher did not welcome this rank "
                            f"within {timeout:g} s (--connect-timeout); see rank 0's error.")
    return conn
