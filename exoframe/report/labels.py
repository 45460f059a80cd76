"""The names a reader gives a report's setups, shared by its figures and its paper tables:
a strategy with the parameters that differ between setups ("diloco (H=20)"), a network
by its bottleneck bandwidth and latency ("100 Mbit/s, 25 ms"), not by a file's name."""
from __future__ import annotations

from pathlib import Path

from ..sim.network.units import format_bandwidth, format_duration
from .groups import STRATEGY_PARAM, column_name, setting

# What every label already says, or what a network's label says.
_SHOWN = ("strategy", "net", "faults", "projection", "latency")


def label_keys(rows: list[dict]) -> list[str]:
    """The setting's fields whose values differ between the rows: a strategy parameter
    (defaults included) where it differs among the rows of the strategies that have it
    (diloco's H=20 beside streaming-diloco's H=50), any other field where it differs."""
    keys = list(dict.fromkeys(k for r in rows for k in _setting(r) if k not in _SHOWN))
    shown = []
    for key in keys:
        having = [r for r in rows if _setting(r).get(key) is not None] \
            if key.startswith(STRATEGY_PARAM) else rows
        if len({_text(_setting(r).get(key)) for r in having}) > 1:
            shown.append(key)
    return shown


def strategy_label(row: dict, keys: list[str]) -> str:
    """'diloco (H=20)': the strategy and its values of `keys` (those it has)."""
    values = [f"{column_name(k)}={_text(_setting(row).get(k))}" for k in keys
              if _setting(row).get(k) is not None]
    return row["strategy"] + (f" ({', '.join(values)})" if values else "")


def value(row: dict, key: str):
    """The row's value of a label key (a strategy parameter with its default)."""
    return _setting(row).get(key)


def _setting(row: dict) -> dict:
    """groups.setting, with the strategy's parameters as the run resolved them (summary.json:
    defaults included) where the row has them."""
    params = row.get("strategy_params")
    if not isinstance(params, dict):
        return setting(row)
    return {**{k: v for k, v in setting(row).items() if not k.startswith(STRATEGY_PARAM)},
            **{STRATEGY_PARAM + k: v for k, v in params.items()
               if not isinstance(v, dict) or v}}


def network_names(rows: list[dict]) -> dict[str, str]:
    """Each network of the rows by its bottleneck bandwidth and longest latency ("1 Gbit/s,
    25 ms"); by its name (a YAML file's stem) where the rows lack them or two networks
    would read the same."""
    facts = {}
    for r in rows:
        facts.setdefault(r["net"], (r.get("bottleneck_bandwidth"), r.get("latency")))
    described = {net: _describe(*fact) for net, fact in facts.items()}
    named = {}
    for net, text in described.items():
        twins = [n for n, t in described.items() if t == text]
        named[net] = text if text and len(twins) == 1 else _name(net)
    return named


def network_label(row: dict, names: dict[str, str]) -> str:
    """The row's network as `names` reads it, then its simulated failures and projection."""
    faults = row.get("faults", "none")
    return (names.get(row["net"], _name(row["net"]))
            + (f" (faults {faults})" if faults != "none" else "")
            + (f" [{row['projection']}]" if row.get("projection") else ""))


def _describe(bandwidth, latency) -> str | None:
    if bandwidth is None:
        return None
    return format_bandwidth(bandwidth) + (f", {format_duration(latency)}"
                                          if latency is not None else "")


def _name(net: str) -> str:
    """A network's name as a label: a YAML file's stem; a bandwidth grid's copy
    (wan-100mbps@10mbit) as 'wan-100mbps at 10mbit'."""
    return (Path(net).stem if net.endswith((".yaml", ".yml")) else net).replace("@", " at ")


def _text(value) -> str:
    import json

    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)
