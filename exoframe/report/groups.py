"""What a row of a report is a run of: its whole resolved configuration but the seed.

Each run folder records the configuration it ran with (config.yaml, resolved: the strategy's
parameters with their defaults, the workload's batch size and learning rate). A row's
setting is that configuration with the network it was timed on (a replay's own), its
projection and the network's longest latency; the fields that do not change what a run
computes (where it is written, its sinks, timeouts, packing) are left out. Rows of one
setting are the seeds of one group, so a report needs no sweep to group its runs: runs made
by hand group the same way. Two rows of one setting and one seed are one seed run twice,
and a report refuses them (one line naming both folders).
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import ExoframeError
from ..inputs import read_yaml
from ..sim.network.units import format_duration

# RunConfig fields that do not change what a run computes, or that a row gives itself.
NOT_SETTING = frozenset({"seed", "out", "sinks", "hang_timeout", "connect_timeout",
                         "checkpoint_every", "nodes_per_process", "net", "faults"})
# Shown by every table already (strategy; the network with its failures and projection).
SHOWN = ("strategy", "net", "faults", "projection")
STRATEGY_PARAM = "strategy_params."
# Short column names of the nested parameters, as the flags give them (-p H=5, -w n_layer=2).
PREFIXES = {STRATEGY_PARAM: "", "workload_params.": "w.", "optimizer_params.": "o."}


def read_config(run_dir: Path) -> dict:
    """The run's recorded configuration (config.yaml), flattened, without the fields that
    are not a setting; {} for a folder without one (made before it was recorded)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return {}
    config = read_yaml(path, "config")  # strict: no aliases, depth and size limits
    if not isinstance(config, dict):
        raise ExoframeError(f"{path}: expected a mapping of run config fields; the file is "
                            "corrupt: run again to remake it.")
    return {key: value for key, value in flatten(config).items()
            if key.split(".")[0] not in NOT_SETTING}


def flatten(mapping: dict, prefix: str = "") -> dict:
    """{"strategy_params": {"H": 5}} -> {"strategy_params.H": 5}; an empty mapping is left
    out (ddp's parameters are none, not a value that differs); other values as they are."""
    flat = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def setting(row: dict) -> dict:
    """Everything the row's run and its timing depend on, but the seed."""
    return {**row.get("config", {}), **{key: row.get(key) for key in SHOWN},
            "latency": row.get("latency")}


def setting_key(row: dict, leave_out=lambda key: False) -> str:
    """The row's setting as one hashable value (rows of one key are seeds of one group),
    without the fields `leave_out(key)` names."""
    return json.dumps({k: v for k, v in setting(row).items() if not leave_out(k)},
                      sort_keys=True, default=str)


def varying(rows: list[dict]) -> list[str]:
    """The setting's fields, beyond those every table shows, whose values differ between
    the rows: a strategy's parameter where it differs between rows of that strategy, any
    other field where it differs at all. In the order of the first row's configuration."""
    keys = list(dict.fromkeys(k for r in rows for k in setting(r) if k not in SHOWN))
    shown = []
    for key in keys:
        if key.startswith(STRATEGY_PARAM):
            differs = any(len({_text(r, key) for r in rows if r["strategy"] == strategy}) > 1
                          for strategy in {r["strategy"] for r in rows})
        else:
            differs = len({_text(r, key) for r in rows}) > 1
        if differs:
            shown.append(key)
    return shown


def column_name(key: str) -> str:
    for prefix, short in PREFIXES.items():
        if key.startswith(prefix):
            return short + key[len(prefix):]
    return key


def cells(row: dict, keys: list[str]) -> list[str]:
    """The row's value of each key, as a table shows it ("-" where it has none)."""
    return [_text(row, key) for key in keys]


def variant(row: dict, keys: list[str]) -> str:
    """The row's values of `keys` as a label: "H=5, partition=dirichlet:0.1"; a strategy
    without the parameter leaves it out."""
    return ", ".join(f"{column_name(key)}={value}" for key, value in zip(keys, cells(row, keys))
                     if value != "-")


def _text(row: dict, key: str) -> str:
    value = setting(row).get(key)
    if value is None:
        return "-"
    if key == "latency":
        return format_duration(value)
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def check_distinct_seeds(rows: list[dict]):
    """One line when two rows of one setting have the same seed: a seed counts once."""
    seen = {}
    for row in rows:
        key = (setting_key(row), row.get("seed"))
        if key in seen:
            first = seen[key]
            raise ExoframeError(
                f"seed: runs {first['run_dir']} and {row['run_dir']} have the same "
                f"configuration and seed {row.get('seed')} on {row['net']}, so they are one "
                "seed twice, not two seeds; leave one of them out of the report (or run "
                "another --seed).")
        seen[key] = row
