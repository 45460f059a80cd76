"""A bandwidth over time, as a network file writes it (a NIC's or a link's
`bandwidth_trace:`): [[time, bandwidth], ...] or a CSV file of time,bandwidth lines, made
((time s, bytes/s), ...); each bandwidth holds from its time on, and 'down' (or 0) stops
the link until the next entry."""
from __future__ import annotations

import math
from pathlib import Path

from ...errors import ExoframeError, shorten
from ...inputs import YAML_LIMIT, read_text
from .units import format_duration, parse_bandwidth, parse_duration


def parse_trace(value: list | str, path: str, where: str) -> tuple:
    """`value` at field `path` of the file `where` (a CSV's name is relative to its
    folder); every error is one line naming both."""
    if isinstance(value, str):
        value, path = _read_csv(value, path, where)
    trace = []
    for i, entry in enumerate(value):
        field = f"{path}[{i}]"
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2) or None in entry:
            raise _error(where, field, f"expected [time, bandwidth] like ['10min', '50mbit'], "
                                       f"got {shorten(entry)}.")
        t = parse_duration(entry[0], f"{field} time", where)
        if entry[1] in (0, "0", "down"):
            bandwidth = 0.0  # the link is down: its flows wait until a later entry
        else:
            bandwidth = parse_bandwidth(entry[1], f"{field} bandwidth", where)
        if not bandwidth < math.inf:
            raise _error(where, field, "a traced bandwidth must be finite; write 'down' (or 0) "
                                       "for a link that is down.")
        if trace and t <= trace[-1][0]:
            raise _error(where, field, f"times must increase: {entry[0]} comes after "
                                       f"{format_duration(trace[-1][0])}.")
        trace.append((t, bandwidth))
    return tuple(trace)


def _error(where: str, path: str, problem: str) -> ExoframeError:
    return ExoframeError(f"{where}: {path}: {problem}")


def _read_csv(name: str, path: str, where: str) -> tuple[list, str]:
    """The [time, bandwidth] rows of a CSV file (blank lines, '#' comments and a header
    line skipped), and the path naming it in messages."""
    file = Path(name)
    if not file.is_absolute() and Path(where).is_file():
        file = Path(where).parent / file
    try:
        lines = read_text(file, "trace file", YAML_LIMIT).splitlines()
    except ExoframeError as e:
        raise _error(where, path, f"{e} Give a CSV of time,bandwidth lines.") from None
    rows = [[cell.strip() for cell in line.split(",")] for line in lines
            if line.strip() and not line.lstrip().startswith("#")]
    if rows and rows[0][0].lower() in ("time", "t", "seconds"):
        rows = rows[1:]
    return [[_number_or_text(cell) for cell in row] for row in rows], f"{path} ({name})"


def _number_or_text(cell: str):
    """A CSV cell: 0 as a number (a time of 0 needs no unit), else the text ('600s')."""
    try:
        return float(cell) if float(cell) == 0 else cell
    except ValueError:
        return cell
