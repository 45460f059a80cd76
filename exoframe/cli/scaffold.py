"""`exoframe new-plugin NAME`: a plugin package that installs, tests and runs as written.

exoframe-NAME/
  pyproject.toml             the entry point in group `exoframe`
  exoframe_NAME/__init__.py  the hook that registers the strategy as NAME, by name (lazily:
                             `exoframe --help` and the listings import no torch)
  exoframe_NAME/strategy.py  the strategy
  tests/test_exoframe_NAME.py
"""
from __future__ import annotations

import re
from pathlib import Path
from string import Template

from ..errors import ExoframeError
from ..files import write_atomic

PYPROJECT = Template('''\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "The $name strategy for exoframe."
requires-python = ">=3.10"
dependencies = ["exoframe"]

[project.optional-dependencies]
dev = ["pytest>=7"]

# exoframe finds the plugin through this entry point: `pip install` is all it takes.
[project.entry-points.exoframe]
$name = "$module"

[tool.setuptools]
packages = ["$module"]
''')

HOOK = Template('''\
"""$dist: the `$name` strategy for exoframe.

The strategy is registered by name ("module:attribute"): exoframe imports it, and torch,
only when a run uses it, so `exoframe --help` and `exoframe strategies` stay fast."""
import exoframe
from exoframe.plugins import lazy


@exoframe.hookimpl
def exoframe_register_strategies(register):
    register("$name", lazy("$module.strategy:$cls"))
''')

MODULE = Template('''\
"""The `$name` strategy."""
from dataclasses import dataclass

import exoframe


class $cls(exoframe.Strategy):
    """Local steps, then average parameters every H steps."""

    @dataclass
    class Params:
        H: int = 10

    def step(self):  # called after each backward pass, on every rank
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.step_num % self.params.H == 0:
            self.average_parameters()  # one all-reduce through self.comm
''')

TEST = Template('''\
"""$dist is installed, registered under its package name, steps right and trains."""
import torch

from exoframe import testing
from exoframe.plugins import PluginManager
from $module.strategy import $cls


def test_registered_through_the_entry_point():
    entry = PluginManager().strategies.get("$name")
    assert entry.source == "$dist"


def test_step_without_processes():
    strategy = testing.solo($cls, {"H": 1}, lr=0.1)
    batch = testing.tiny_data()(0, 1, "train")[:]  # (inputs, targets)
    strategy.model(batch).backward()
    params = list(strategy.model.parameters())
    expected = [(p - 0.1 * p.grad).detach() for p in params]
    strategy.step_num = 1
    strategy.step()  # one rank: averaging changes nothing, so this is one SGD step
    for p, e in zip(params, expected):
        assert torch.allclose(p, e)


def test_trains_and_with_h_1_equals_ddp():
    result = testing.run("$name", {"H": 1}, nodes=2, steps=20)
    losses = [row["loss"] for row in result.metrics]
    assert losses[-1] < losses[0]
    assert testing.max_difference(result, testing.run("ddp", nodes=2, steps=20)) < 1e-5
''')

README = Template('''\
# $dist

The `$name` strategy for exoframe, as a plugin package. What a strategy may rely on
(`self.comm`, the helpers, failures) is in exoframe's `docs/strategies.md`, the plugin hooks
in its `docs/plugins.md`; from Python: `python -c "import exoframe; help(exoframe.Strategy)"`.

```bash
pip install -e .                # exoframe finds it through the `exoframe` entry point
exoframe strategies             # $name ... [$dist]
exoframe run --strategy $name --workload mlp -p H=20
python -m pytest tests
```
''')

NAME = re.compile(r"[a-z][a-z0-9_-]*")


def write_skeleton(name: str, parent=".") -> Path:
    """Write exoframe-NAME under `parent` and return its folder."""
    if not NAME.fullmatch(name):
        raise ExoframeError(f"plugin name '{name}': use lowercase letters, digits, '-' and '_', "
                            "starting with a letter (it becomes the strategy's name).")
    module = "exoframe_" + name.replace("-", "_")
    values = {"name": name, "dist": f"exoframe-{name}", "module": module,
              "cls": "".join(part.capitalize() for part in re.split(r"[-_]", name))}
    folder = Path(parent) / values["dist"]
    if folder.exists():
        raise ExoframeError(f"{folder} already exists; choose another name or remove it.")
    files = {"pyproject.toml": PYPROJECT, f"{module}/__init__.py": HOOK,
             f"{module}/strategy.py": MODULE,
             f"tests/test_{module}.py": TEST, "README.md": README}
    for relative, template in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, template.substitute(values))
    return folder
