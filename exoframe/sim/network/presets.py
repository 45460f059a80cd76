"""The built-in network presets: netmodels/*.yaml, installed as the package exoframe.netmodels."""
from __future__ import annotations

import importlib.resources
from pathlib import Path

from ...inputs import load_yaml

PRESET_DIR = importlib.resources.files("exoframe.netmodels")


def presets() -> list[tuple[str, Path]]:
    """(name, path) of every preset file, by name."""
    paths = (Path(str(file)) for file in PRESET_DIR.iterdir() if file.name.endswith(".yaml"))
    return sorted((path.stem, path) for path in paths)


def description(path: Path) -> str:
    """A preset file's description (read when asked: a run reads only the preset it uses)."""
    return str(load_yaml(path).get("description", ""))
