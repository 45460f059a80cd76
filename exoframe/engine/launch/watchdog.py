"""The launcher's progress watchdog: when no child has said anything for a while, say who
waits for what and which process made no progress, with its Python stack, instead of
waiting for gloo's timeout (which fires in a waiting rank and so blames the wrong one)."""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from ..ipc.processes import STACK_SIGNAL, child_name
from ..plan.target import LAG


def process_state(pid: int) -> str:
    """The kernel's one-letter state of `pid` (R, S, D, T stopped, t traced, ...), or ''."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def describe_stall(monitor, seconds: float) -> tuple[str, list[int]]:
    """One line: the processes that made no progress first, then what the others wait for;
    and the indices (in monitor.processes) of the local running ones that made no progress."""
    sim, nodes = monitor.sim, monitor.job.nodes
    waiting_verdict = monitor.verdicts.waiting
    stopped, idle, waits, stuck = [], [], [], []
    evaluator = None
    for i, who in enumerate(monitor.who):
        name = child_name(who)
        process = monitor.processes[i]  # None: a rank on another machine, or a thread here
        here = process is not None or i not in monitor.hosts  # (a thread: --in-process)
        if process is not None and process_state(process.pid) in ("T", "t"):
            stopped.append(name)
        elif i == nodes:  # the evaluator: culprit only if no rank is (see below)
            if monitor.rows.awaiting_steps():
                evaluator = (i, name, min(monitor.rows.awaiting_steps()))
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
        elif i in sim.paused:
            waits.append(f"{name} waits for its worker's other nodes, to compute step "
                         f"{sim.paused[i]} with them (--stack-replicas)")
        else:
            idle.append(name)
            if here:
                stuck.append(i)
    if evaluator is not None:  # a validation waits for a stuck rank's model, if any is stuck
        index, name, step = evaluator
        if idle or stopped:
            waits.append(f"{name} waits to validate step {step}")
        else:
            idle.append(f"{name} (validating step {step})")
            stuck.append(index)
    if stopped:  # a stopped process explains everyone else outside the simulator
        culprit = f"{', '.join(stopped)} stopped (SIGSTOP or SIGTSTP) and made no progress"
        waits += [f"{name} waits outside the simulator" for name in idle]
    elif idle:
        culprit = f"{', '.join(idle)} made no progress"
    else:
        culprit = "no process made progress"
    details = f"; {'; '.join(waits)}" if waits else ""
    line = (f"no progress for {seconds:g} s: {culprit}{details}. Resume or fix the stuck "
            "process, or raise --hang-timeout if a step legitimately takes longer.")
    return line, [] if stopped else stuck  # a stopped process cannot answer for its stack


def dump_stacks(children, wait: float = 2.0) -> str:
    """The Python stacks of the stuck `children` ((name, pid, stack file) each), which write
    them on STACK_SIGNAL (processes.py); a child that does not answer within `wait` seconds
    is said to."""
    for _, pid, _ in children:
        try:
            os.kill(pid, STACK_SIGNAL)
        except OSError:
            pass
    texts, deadline = [], time.monotonic() + wait
    for name, _, path in children:
        text = ""
        while time.monotonic() < deadline:
            text = _read(path)
            time.sleep(0.1)  # let a dump in progress finish
            if text and _read(path) == text:
                break
        texts.append(f"Python stack of {name} (faulthandler):\n{_own_frames(text)}" if text
                     else f"{name} did not write its stack within {wait:g} s.")
    return "\n\n".join(texts)


def thread_stacks(threads) -> str:
    """The Python stacks of the stuck `threads` of this process ((name, thread name) each:
    the worker and the evaluator of an --in-process run). A worker thread's is the stack of
    the node it runs, a greenlet's frames being its thread's while it runs."""
    frames = sys._current_frames()
    by_name = {thread.name: thread for thread in threading.enumerate()}
    texts = []
    for name, thread_name in threads:
        thread = by_name.get(thread_name)
        frame = frames.get(thread.ident) if thread is not None else None
        if frame is not None:
            stack = "".join(traceback.format_stack(frame)).rstrip()
            texts.append(f"Python stack of {name} (a thread of this process):\n{stack}")
    return "\n\n".join(texts)


def _own_frames(stack: str) -> str:
    """The child's frames: those below its entry point are the launcher's, copied by fork."""
    lines = stack.rstrip().splitlines()
    entry = next((i for i, line in enumerate(lines) if line.endswith(" in child_entry")), None)
    return "\n".join(lines if entry is None else lines[:entry + 1])


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _pending(sim, rank: int) -> str:
    """What the simulator has not answered `rank` yet."""
    for (r, _), (op, index) in sim.handles.items():
        if r == rank and op.done_at[index] is None:
            missing = [op.participants[i] for i, j in enumerate(op.joined_at) if j is None]
            return op.describe() + (f", which rank(s) {', '.join(map(str, missing))} did "
                                    "not join" if missing else "")
    # Its request is queued: the simulator cannot pass the clock of a rank that is late.
    return "the simulated network, held back by the late rank(s)"
