"""The built-in network presets: netmodels/*.yaml, installed as the package exoframe.netmodels."""
from __future__ import annotations

import importlib.resources
from pathlib import Path

from .inputs import load_yaml

PRESET_DIR = importlib.resources.files("exoframe.netmodels")


def presets() -> list[tuple[str, Path, str]]:
    """(name, path, description) of every preset file, by name."""
    found = []
    for file in sorted(PRESET_DIR.iterdir(), key=lambda f: f.name):
        if file.name.endswith(".yaml"):
            path = Path(str(file))
            found.append((path.stem, path, str(load_yaml(path).get("description", ""))))
    return found
