"""A collective's plan: the flows an operation among n participants becomes, each carrying a
fraction of the payload, with what each waits for (collectives.py holds the algorithms)."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

AT_JOIN = -1  # a notice sent as soon as the receiver joins the operation


@dataclass
class Plan:
    n: int
    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    fraction: list[float] = field(default_factory=list)
    deps: list[list[int]] = field(default_factory=list)
    # flow -> what its receiver must have done before it says "ready" (a zero-byte notice
    # that takes the path back, as gloo's receiver-driven transport sends): a flow id whose
    # delivery, or AT_JOIN (the receiver has joined the operation). No entry: no notice.
    notices: dict[int, int] = field(default_factory=dict)

    def add(self, src: int, dst: int, fraction: float, deps=(), notice: int | None = None) -> int:
        self.src.append(src)
        self.dst.append(dst)
        self.fraction.append(fraction)
        self.deps.append(list(deps))
        f = len(self.src) - 1
        if notice is not None:
            self.notices[f] = notice
        return f

    def __len__(self):
        return len(self.src)

    @functools.cached_property
    def compiled(self) -> "CompiledPlan":
        return CompiledPlan(self)


class CompiledPlan:
    """What running a plan needs, derived once per plan.

    waiting[f]: how many things flow f waits for (its deps plus the joins of those of its
    ends that no dependency already guarantees, plus its receiver's notice); gated[p]: flows
    that wait for participant p to join; successors[f]; noticed_after[f] and
    noticed_at_join[p]: flows whose receiver sends its notice once f is delivered, or once
    p joins (the notice then takes the path back before the flow may start);
    touching[p]: flows p sends or receives; bytes per participant.
    """

    def __init__(self, plan: Plan):
        n, count = plan.n, len(plan)
        srcs, dsts, fractions, all_deps = plan.src, plan.dst, plan.fraction, plan.deps
        successors = self.successors = [[] for _ in range(count)]
        gated = self.gated = [[] for _ in range(n)]
        waiting = self.waiting = [0] * count
        touching = self.touching = [0] * n
        sent = self.sent = [0.0] * n  # fraction of S each participant sends
        received = self.received = [0.0] * n
        notices = plan.notices
        self.noticed_after: dict[int, list[int]] = {}
        self.noticed_at_join: dict[int, list[int]] = {}
        for f in range(count):  # (a ring among 1024 has 2M flows: kept lean)
            src, dst, deps = srcs[f], dsts[f], all_deps[f]
            if not (0 <= src < n and 0 <= dst < n) or src == dst:
                raise ValueError(f"flow {f}: bad ends {src} -> {dst} for {n} participants")
            src_covered = dst_covered = False
            for d in deps:
                if not 0 <= d < f:
                    raise ValueError(f"flow {f} depends on flow {d}, which is not before it")
                successors[d].append(f)
                ends = (srcs[d], dsts[d])
                src_covered = src_covered or src in ends
                dst_covered = dst_covered or dst in ends
            count_waiting = len(deps)
            notice = notices.get(f) if notices else None
            if notice is not None:
                count_waiting += 1
                if notice == AT_JOIN:
                    self.noticed_at_join.setdefault(dst, []).append(f)
                    dst_covered = True
                else:
                    if not (0 <= notice < f and dst in (srcs[notice], dsts[notice])):
                        raise ValueError(f"flow {f}: its notice follows flow {notice}, which "
                                         f"is not an earlier flow of its receiver {dst}")
                    self.noticed_after.setdefault(notice, []).append(f)
                    dst_covered = True
            if not src_covered:
                gated[src].append(f)
                count_waiting += 1
            if not dst_covered:
                gated[dst].append(f)
                count_waiting += 1
            waiting[f] = count_waiting
            touching[src] += 1
            touching[dst] += 1
            sent[src] += fractions[f]
            received[dst] += fractions[f]
