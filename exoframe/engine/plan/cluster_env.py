"""What torchrun tells a rank (RANK, WORLD_SIZE, MASTER_ADDR, ...), read and checked before
anything starts; the run's token for ranks across machines."""
from __future__ import annotations

import ipaddress
import os
import secrets
from dataclasses import dataclass

from ...errors import ExoframeError

MIN_TOKEN = 16  # characters of EXOFRAME_TOKEN


@dataclass(frozen=True)
class ClusterEnv:
    """What torchrun tells each rank."""
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    run_id: str
    attempt: int  # TORCHELASTIC_RESTART_COUNT
    agent_store: bool  # torchrun's agent hosts the store; else rank 0 does
    local_world_size: int = 1  # ranks on this machine

    @classmethod
    def from_environ(cls, environ=os.environ) -> "ClusterEnv | None":
        """None unless the process was started by torchrun (RANK and WORLD_SIZE set)."""
        if "RANK" not in environ or "WORLD_SIZE" not in environ:
            return None
        names = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        missing = [n for n in names if not environ.get(n)]
        if missing:
            raise ExoframeError(f"{', '.join(missing)} not set: a rank of a multi-machine run "
                                "needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; start it "
                                "with torchrun, which sets them.")
        try:
            rank, world, port = (int(environ[n]) for n in ("RANK", "WORLD_SIZE", "MASTER_PORT"))
            local_rank = int(environ.get("LOCAL_RANK", rank))
            local_world = int(environ.get("LOCAL_WORLD_SIZE", 1))
            attempt = int(environ.get("TORCHELASTIC_RESTART_COUNT", 0))
        except ValueError:
            raise ExoframeError("RANK, WORLD_SIZE, LOCAL_RANK and MASTER_PORT must be integers; "
                                "start the rank with torchrun, which sets them.") from None
        if not 0 <= rank < world:
            raise ExoframeError(f"RANK is {rank} but WORLD_SIZE is {world}: RANK must be in "
                                f"0..{world - 1}.")
        return cls(rank, world, local_rank, environ["MASTER_ADDR"], port,
                   environ.get("TORCHELASTIC_RUN_ID", "none"), attempt,
                   environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
                   local_world)

    def check_nodes(self, nodes: int):
        if nodes != self.world_size:
            raise ExoframeError(f"nodes: {nodes}, but torchrun started {self.world_size} ranks "
                                "(WORLD_SIZE): drop --nodes under torchrun, or make them agree.")

    def check_config(self, config):
        """What a run across machines needs, and what it cannot do yet."""
        if not self.is_loopback():
            self.token()  # EXOFRAME_TOKEN is set
        if self.shared_token is not None and len(self.shared_token) < MIN_TOKEN:
            raise ExoframeError(
                f"EXOFRAME_TOKEN: {len(self.shared_token)} characters is too short to keep "
                f"others out; give at least {MIN_TOKEN}, e.g. export EXOFRAME_TOKEN=$(python -c "
                "'import secrets; print(secrets.token_hex(16))').")
        if config.checkpoint_every is not None:
            raise ExoframeError("checkpoint_every: checkpoints are not supported under torchrun "
                                "yet (each rank would save on its own machine); drop "
                                "--checkpoint-every, or run on one machine.")

    @property
    def prefix(self) -> str:
        """The keys of this run's attempt in the rendezvous store."""
        return f"exoframe/{self.run_id}/{self.attempt}/"

    def is_loopback(self) -> bool:
        """Whether the rendezvous is named on loopback (localhost, 127.0.0.1, ::1): every rank
        on this machine. Read from the name itself, so that every rank decides alike (a
        machine's own name may resolve to 127.0.1.1 there and to its address elsewhere)."""
        if self.master_addr == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.master_addr).is_loopback
        except ValueError:
            return False

    def listen_address(self) -> str:
        """Rank 0's service: on loopback when every rank is on this machine, else on every
        interface (its connections must prove the token)."""
        return self.master_addr if self.is_loopback() else ""

    @property
    def shared_token(self) -> bytes | None:
        """EXOFRAME_TOKEN: the secret set on every machine, if any."""
        shared = os.environ.get("EXOFRAME_TOKEN")
        return shared.encode() if shared else None

    @property
    def store_address(self) -> tuple:
        """(host, port, key prefix) of this run in the rendezvous store."""
        return self.master_addr, self.master_port, self.prefix

    def token(self, published: str | None = None) -> bytes:
        """The run's token: EXOFRAME_TOKEN, else (every rank on this machine) one that rank 0
        makes and writes to a private file (`published`: its content, on the other ranks)."""
        if self.shared_token is not None:
            return self.shared_token
        if not self.is_loopback():
            raise ExoframeError(
                "EXOFRAME_TOKEN: a run across machines needs a shared secret, and torchrun's "
                "rendezvous store is open to anyone who reaches it. Set the same one on every "
                "machine, e.g. export EXOFRAME_TOKEN=$(python -c 'import secrets; "
                "print(secrets.token_hex(16))').")
        return secrets.token_bytes(32) if published is None else bytes.fromhex(published)
