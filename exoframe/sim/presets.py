"""The built-in network presets: netmodels/*.yaml, installed as the package exoframe.netmodels."""
from __future__ import annotations

import importlib.resources
from pathlib import Path

from ..config import load_yaml
from ..hookspecs import hookimpl

PRESET_DIR = importlib.resources.files("exoframe.netmodels")


@hookimpl
def exoframe_register_networks(register):
    for file in sorted(PRESET_DIR.iterdir(), key=lambda f: f.name):
        if file.name.endswith(".yaml"):
            path = Path(str(file))
            register(path.stem, path, description=str(load_yaml(path).get("description", "")))
