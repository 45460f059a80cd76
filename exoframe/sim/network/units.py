"""Bandwidth and duration strings in tc / Mininet style ("100mbit", "25ms") to SI numbers.

Every error is one line: "{where}: {field}: {problem and fix}".
"""
from __future__ import annotations

import math
import re

from ...errors import ExoframeError, did_you_mean, shorten
from .topology import FIFO_PACKETS, Queue

# Bits per second per unit; case-insensitive, "/s" suffix optional ("mbit" or "Mbit/s").
BIT_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
# Bytes per second per unit; case-sensitive, because B (bytes) vs b (bits) is the point.
BYTE_UNITS = {"B/s": 1.0, "kB/s": 1e3, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12}
# tc reads these as bytes per second while most people mean bits: refuse to guess.
AMBIGUOUS_UNITS = {"bps", "kbps", "mbps", "gbps", "tbps"}
UNLIMITED = {"inf", "unlimited"}

# Units per second (dividing by 1e6 gives 5e-06 for '5us' where multiplying by 1e-6 does not).
# Both micro signs are accepted: U+00B5 (what keyboards type) and Greek mu U+03BC.
DURATION_UNITS = {"h": 1 / 3600, "min": 1 / 60, "s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6,
                  "\u03bcs": 1e6, "ns": 1e9}
_DURATION_LISTING = "h, min, s, ms, us, µs, ns"
YEAR = 365.25 * 86400  # seconds

_NUMBER_UNIT = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*")


def _error(where: str, field: str, problem: str) -> ExoframeError:
    return ExoframeError(f"{where}: {field}: {problem}")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _split(value, field: str, where: str, example: str) -> tuple[float, str]:
    """'100 mbit' -> (100.0, 'mbit'); '100' -> (100.0, '')."""
    if not isinstance(value, str):
        raise _error(where, field, f"expected a string like '{example}', got {shorten(value)}.")
    match = _NUMBER_UNIT.fullmatch(value)
    if match is None:
        raise _error(where, field, f"expected a number and a unit like '{example}', "
                                   f"got '{shorten(value)}'.")
    number = float(match.group(1))
    if not math.isfinite(number):  # '1e999mbit'
        raise _error(where, field, f"'{shorten(value)}' is too large a number.")
    return number, match.group(2)


def _bandwidth_unit(unit: str) -> float | None:
    """Bytes per second of one `unit`, or None if it is not a known unit."""
    if unit in BYTE_UNITS:
        return BYTE_UNITS[unit]
    bits = unit.lower().removesuffix("/s")
    if bits in BIT_UNITS:
        return BIT_UNITS[bits] / 8
    return None


def _unknown_unit(unit: str, likely: list[str], units: str) -> str:
    # Match lower-cased so that 'Gb' finds 'gbit' and 'MS' finds 'ms', then show the real spelling.
    by_lower = {k.lower(): k for k in reversed(likely)}
    hint = did_you_mean(unit.lower(), by_lower)
    if hint:
        hint = f" Did you mean '{by_lower[hint.split(chr(39))[1]]}'?"
    return f"unknown unit '{unit}'.{hint} Units: {units}."


def parse_bandwidth(value, field: str, where: str) -> float:
    """'100mbit' -> 12_500_000.0 bytes/s; 'inf' or 'unlimited' (or YAML's .inf) -> math.inf."""
    if _is_number(value) and math.isinf(value) and value > 0:
        return math.inf
    if _is_number(value) and math.isnan(value):
        raise _error(where, field, "must be a bandwidth like '100mbit' or 'inf', got NaN.")
    if isinstance(value, str) and value.strip().lower() in UNLIMITED:
        return math.inf
    if _is_number(value):
        raise _error(where, field, f"{value!r} has no unit; write e.g. '{value:g}mbit' "
                                   f"(megabits/s) or '{value:g}MB/s' (megabytes/s).")
    number, unit = _split(value, field, where, "100mbit")
    if not unit:
        raise _error(where, field, f"'{value}' has no unit; write e.g. '{number:g}mbit' "
                                   f"(megabits/s) or '{number:g}MB/s' (megabytes/s).")
    if unit.lower() in AMBIGUOUS_UNITS:
        prefix = unit.lower().removesuffix("bps")
        raise _error(where, field, f"'{unit}' is ambiguous: tc reads it as bytes/s, most people "
                                   f"mean bits/s. Write '{number:g}{prefix}bit' for bits/s or "
                                   f"'{number:g}{prefix.upper()}B/s' for bytes/s "
                                   f"(e.g. '100mbit' = '12.5MB/s').")
    scale = _bandwidth_unit(unit)
    if scale is None:
        # A capital B says bytes; anything else is most likely meant as bits ('mbs', 'Gb').
        likely = [*BYTE_UNITS] if "B" in unit else [*BIT_UNITS]
        units = f"{', '.join([*BIT_UNITS, *BYTE_UNITS])} (bits: any case, '/s' optional), or inf"
        raise _error(where, field, _unknown_unit(unit, likely, units))
    if not number > 0:
        raise _error(where, field, f"must be positive, got '{value}' "
                                   f"(use 'inf' for unlimited).")
    if number * scale * YEAR < 1:
        raise _error(where, field, f"'{value}' moves less than a byte a year; a unit is off "
                                   "(e.g. '100mbit', '1gbit').")
    return number * scale


def parse_duration(value, field: str, where: str) -> float:
    """'25ms' -> 0.025 seconds. A bare 0 needs no unit."""
    if _is_number(value) and value == 0:
        return 0.0
    if _is_number(value) and not math.isfinite(value):
        raise _error(where, field, f"must be a finite duration like '25ms', got {value}.")
    if _is_number(value):
        raise _error(where, field, f"{value!r} has no unit; write e.g. '{value:g}ms' "
                                   f"(units: {_DURATION_LISTING}).")
    number, unit = _split(value, field, where, "25ms")
    if number < 0:
        raise _error(where, field, f"must not be negative, got '{value}'.")
    if not unit:
        if number == 0:
            return 0.0
        raise _error(where, field, f"'{value}' has no unit; write e.g. '{number:g}ms' "
                                   f"(units: {_DURATION_LISTING}).")
    if unit not in DURATION_UNITS:
        raise _error(where, field, _unknown_unit(unit, _DURATION_LISTING.split(', '),
                                                         _DURATION_LISTING))
    return number / DURATION_UNITS[unit]


def _scaled(value: float, units: list[tuple[float, str]], digits: int = 3) -> str:
    """Pick the largest unit whose rendering with `digits` significant digits is at least 1."""
    for scale, name in reversed(units):
        if float(f"{value / scale:.{digits}g}") >= 1:
            return f"{value / scale:.{digits}g} {name}"
    scale, name = units[0]
    return f"{value / scale:.{digits}g} {name}"


def parse_seconds(value, field: str, where: str) -> float:
    """A finite time given either as a bare number of seconds ('0.25') or with a unit
    ('250ms')."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return parse_duration(value, field, where)
    if not math.isfinite(seconds):
        raise _error(where, field, f"must be a finite time like '0.25' or '250ms', "
                                   f"got '{shorten(value)}'.")
    return seconds


def format_bandwidth(bytes_per_s: float, digits: int = 3) -> str:
    """12_500_000.0 -> '100 Mbit/s'; math.inf -> 'unlimited'."""
    if math.isinf(bytes_per_s):
        return "unlimited"
    return _scaled(bytes_per_s * 8, [(1.0, "bit/s"), (1e3, "kbit/s"), (1e6, "Mbit/s"),
                                     (1e9, "Gbit/s"), (1e12, "Tbit/s")], digits)


def format_duration(seconds: float) -> str:
    """0.025 -> '25 ms'; 5e-6 -> '5 µs'; 0 -> '0'."""
    if seconds == 0:
        return "0"
    return _scaled(seconds, [(1e-9, "ns"), (1e-6, "µs"), (1e-3, "ms"), (1.0, "s"),
                             (YEAR, "years")])


def parse_loss(value, field: str, where: str) -> float:
    """A packet loss rate as written: a fraction (0.001) or a percentage ('0.1%'), in [0, 1)."""
    text = value.strip() if isinstance(value, str) else value
    scale = 1.0
    if isinstance(text, str) and text.endswith("%"):
        text, scale = text[:-1].strip(), 0.01
    try:
        rate = float(text) * scale
    except (TypeError, ValueError):
        raise _error(where, field, f"expected a loss rate like 0.001 or '0.1%', got "
                                   f"{value!r}.") from None
    if isinstance(value, bool) or not 0 <= rate < 1:
        raise _error(where, field, f"a loss rate is in [0, 1) (a fraction of packets), got "
                                   f"{value!r}.")
    return rate


def parse_queue(value, field: str, where: str) -> Queue:
    """A queue as written: 'fair', 'fifo', 'fifo 50ms' (its depth at the link's rate) or
    'fifo 100 packets' (topology.Queue)."""
    example = "fair, fifo, 'fifo 50ms' or 'fifo 100 packets'"
    if not isinstance(value, str):
        raise _error(where, field, f"expected {example}, got {shorten(value)}.")
    discipline, _, depth = value.strip().partition(" ")
    if discipline == "fair" and not depth.strip():
        return Queue("fair")
    if discipline != "fifo":
        raise _error(where, field, f"expected {example}, got '{shorten(value)}'.")
    depth = depth.strip()
    if not depth:
        return Queue("fifo", packets=FIFO_PACKETS)
    number, _, unit = depth.partition(" ")
    if unit.strip() in ("packets", "packet"):
        if not number.isdigit() or int(number) < 1:
            raise _error(where, field, f"a FIFO holds a whole number of packets, at least 1, "
                                       f"like 'fifo 100 packets', got '{shorten(value)}'.")
        return Queue("fifo", packets=int(number))
    seconds = parse_duration(depth, field, where)
    if not seconds > 0:
        raise _error(where, field, f"a FIFO's depth is more than 0, like 'fifo 50ms', got "
                                   f"'{shorten(value)}'.")
    return Queue("fifo", seconds=seconds)
