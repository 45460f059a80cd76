"""The launcher's progress watchdog: when no child has said anything for a while, say who
waits for what and which process made no progress, instead of waiting for gloo's timeout
(which fires in a waiting rank and so blames the wrong one)."""
from __future__ import annotations

from .target import LAG


def process_state(pid: int) -> str:
    """The kernel's one-letter state of `pid` (R, S, D, T stopped, t traced, ...), or ''."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def describe_stall(monitor, seconds: float) -> str:
    """One line: the processes that made no progress first, then what the others wait for."""
    sim, nodes = monitor.sim, monitor.job.nodes
    waiting_verdict = monitor.verdicts.waiting if monitor.verdicts is not None else {}
    stopped, idle, waits = [], [], []
    for i, who in enumerate(monitor.who):
        name = f"rank {who}" if i < nodes else str(who)
        if process_state(monitor.processes[i].pid) in ("T", "t"):
            stopped.append(name)
        elif i == nodes:  # the evaluator
            if monitor.rows.awaiting_val:
                idle.append(f"{name} (validating step {min(monitor.rows.awaiting_val)})")
        elif monitor.results[i] is not None:
            continue
        elif i in waiting_verdict:
            step = waiting_verdict[i]
            validation = (f" and the validation of step {step - LAG}"
                          if monitor.job.target_loss is not None else "")
            waits.append(f"{name} finished step {step} and waits to know whether to stop "
                         f"(for every rank to finish step {step}{validation})")
        elif sim.blocked[i]:
            waits.append(f"{name} waits for {_pending(sim, i)}")
        else:
            idle.append(name)
    if stopped:  # a stopped process explains everyone else outside the simulator
        culprit = f"{', '.join(stopped)} stopped (SIGSTOP or SIGTSTP) and made no progress"
        waits += [f"{name} waits outside the simulator" for name in idle
                  if not name.startswith("evaluator")]
    elif idle:
        culprit = f"{', '.join(idle)} made no progress"
    else:
        culprit = "no process made progress"
    details = f"; {'; '.join(waits)}" if waits else ""
    return (f"no progress for {seconds:g} s: {culprit}{details}. Resume or fix the stuck "
            "process, or raise --hang-timeout if a step legitimately takes longer.")


def _pending(sim, rank: int) -> str:
    """What the simulator has not answered `rank` yet."""
    for (r, _), (op, index) in sim.handles.items():
        if r == rank and op.done_at[index] is None:
            missing = [op.participants[i] for i, j in enumerate(op.joined_at) if j is None]
            return op.describe() + (f", which rank(s) {', '.join(map(str, missing))} did "
                                    "not join" if missing else "")
    # Its request is queued: the simulator cannot pass the clock of a rank that is late.
    return "the simulated network, held back by the late rank(s)"
