"""The package's shape, read from its source with ast: the imports between exoframe's modules
(at the top of a module and inside its functions, relative ones resolved) form no cycle;
the ground floor (errors, inputs) imports nothing of exoframe; exoframe.sim imports nothing
of exoframe outside itself but the ground floor, and no torch; the wings of the engine and of
the simulator import one way; strategies import nothing from the config, the sinks or the
report; no folder but strategies/ holds more than 15 modules; no module is over 400 lines;
the module paths benchmarks/step_overhead.py profiles by exist."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "exoframe"
MAX_LINES = 400
MAX_MODULES = 15  # in one folder (strategies/ is a catalogue: a file per method)
GROUND = ("exoframe.errors", "exoframe.inputs")
# Each package's wings, highest first: a wing imports only the wings after it (and itself).
WINGS = {"exoframe.engine": [("",), ("launch",), ("node",), ("plan", "ipc", "records")],
         "exoframe.sim": [("", "traces"), ("clocks",), ("network",)]}


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package (the netmodels link,
    a folder of YAML presets, excluded)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if "netmodels" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_names(module: str, path: Path, node, modules) -> list[str]:
    """The modules an import statement names: `from pkg import name` is pkg.name where that is
    a module, else pkg."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
            for alias in node.names]


def import_graph() -> tuple[dict[str, set], dict[str, set]]:
    """(module -> the exoframe modules it imports, module -> every top-level package it
    imports), counting imports anywhere in the module."""
    modules = module_files()
    inside, every = {}, {}
    for module, path in modules.items():
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update(imported_names(module, path, node, modules))
        inside[module] = {name for name in names if name in modules}
        every[module] = {name.split(".")[0] for name in names}
    return inside, every


def find_cycle(graph: dict[str, set]) -> list[str] | None:
    """A cycle of the graph as the modules along it (the first repeated at the end), or None."""
    state, path = {}, []  # state: 1 on the current path, 2 done

    def visit(node):
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_finds_a_cycle_and_its_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert reachable(graph, "c") == {"a", "b", "c", "d"}


def test_resolves_relative_and_function_level_imports(tmp_path):
    modules = {"exoframe", "exoframe.engine", "exoframe.engine.job", "exoframe.config"}
    tree = ast.parse("from ..config import RunConfig\n"
                     "def f():\n    from . import job\n    from .job import Job\n")
    path = PACKAGE / "engine" / "rank.py"
    names = [name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             for name in imported_names("exoframe.engine.rank", path, node, modules)]
    assert names == ["exoframe.config", "exoframe.engine.job", "exoframe.engine.job"]


def test_no_import_cycle():
    inside, _ = import_graph()
    assert len(inside) > 100  # (the package was found)
    cycle = find_cycle(inside)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_sim_imports_nothing_above_it_and_no_torch():
    """exoframe.sim imports only exoframe.sim, the ground floor, the standard library, simpy
    and yaml."""
    inside, every = import_graph()
    allowed = set(sys.stdlib_module_names) | {"simpy", "yaml", "exoframe"}
    sim = [m for m in inside if m == "exoframe.sim" or m.startswith("exoframe.sim.")]
    assert len(sim) > 10
    for module in sim:
        above = sorted(m for m in inside[module]
                       if not m.startswith("exoframe.sim") and m not in GROUND)
        assert not above, f"{module} imports {above}, outside exoframe.sim"
        outside = sorted(every[module] - allowed)
        assert not outside, f"{module} imports {outside}"


def reachable(graph: dict[str, set], start: str) -> set:
    """The modules `start` imports, directly or through others."""
    seen, stack = set(), [start]
    while stack:
        for target in graph[stack.pop()] - seen:
            seen.add(target)
            stack.append(target)
    return seen


def test_strategies_import_no_config_sinks_or_report():
    """Not directly, nor through the modules they import."""
    inside, _ = import_graph()
    banned = ("exoframe.config", "exoframe.sinks", "exoframe.report")
    for module in inside:
        if module.startswith("exoframe.strategies"):
            bad = sorted(t for t in reachable(inside, module) if t.startswith(banned))
            assert not bad, f"{module} imports {bad}"


def test_no_module_over_400_lines():
    long = {module: n for module, path in module_files().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_ground_floor_imports_nothing_of_exoframe_and_needs_no_simpy():
    inside, _ = import_graph()
    assert inside["exoframe.errors"] == set()
    assert inside["exoframe.inputs"] == {"exoframe.errors"}
    # (the config, the first thing every command reads, loads no network model either)
    code = ("import sys; sys.modules['simpy'] = None; import exoframe.errors, exoframe.config; "
            "assert 'exoframe.sim.clocks.simulator' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr


def wing_of(module: str, package: str) -> str:
    rest = module[len(package) + 1:].split(".") if module != package else []
    return rest[0] if len(rest) > 1 else ""  # a module of the package itself: ""


def test_wings_import_one_way():
    inside, _ = import_graph()
    for package, floors in WINGS.items():
        floor_of = {wing: i for i, wings in enumerate(floors) for wing in wings}
        subpackages = {m.split(".")[len(package.split("."))] for m in inside
                       if m.startswith(package + ".") and (PACKAGE.parent / m.replace(".", "/")
                                                           ).is_dir()}
        assert subpackages == set(floor_of) - {""}, f"{package}: wings {sorted(subpackages)}"
        for module in inside:
            if not module.startswith(package + "."):
                continue
            mine = wing_of(module, package)
            for target in inside[module]:
                if not target.startswith(package + ".") or wing_of(target, package) == mine:
                    continue
                theirs = wing_of(target, package)
                assert floor_of[theirs] > floor_of[mine], \
                    f"{module} ({mine or package}) imports {target}, a wing above or beside it"


def test_no_folder_but_strategies_holds_more_than_15_modules():
    folders = {}
    for path in PACKAGE.rglob("*.py"):
        if "netmodels" not in path.parts and path.name != "__init__.py":
            folders.setdefault(path.parent.relative_to(PACKAGE.parent), []).append(path.name)
    crowded = {str(folder): len(names) for folder, names in folders.items()
               if len(names) > MAX_MODULES and folder.name != "strategies"}
    assert not crowded, crowded
    assert len(folders) >= 12  # (the wings were found)


def top_level_alternatives(pattern: str) -> list[str]:
    """A regex's alternatives split at its outermost |, groups kept whole."""
    alternatives, depth, start = [], 0, 0
    for i, char in enumerate(pattern):
        depth += {"(": 1, ")": -1}.get(char, 0) if pattern[i - 1:i] != "\\" else 0
        if char == "|" and depth == 0:
            alternatives.append(pattern[start:i])
            start = i + 1
    return alternatives + [pattern[start:]]


def test_step_overhead_profiles_name_modules_that_exist():
    """benchmarks/step_overhead.py gives py-spy's samples to parts by the engine's file paths;
    when a module moved, every worker sample fell to "start-up" and the table read all zeros.
    Each alternative naming an exoframe path matches a module of the package."""
    sys.path.insert(0, str(PACKAGE.parent / "benchmarks"))
    import step_overhead

    paths = [str(path.relative_to(PACKAGE.parent).as_posix()) for path in module_files().values()]
    patterns = [pattern for _, pattern in step_overhead.PARTS]
    patterns += [step_overhead.STARTUP.pattern, step_overhead.IN_TRAINING.pattern]
    named = [alternative[alternative.index("exoframe/"):]
             for pattern in patterns for alternative in top_level_alternatives(pattern)
             if "exoframe/" in alternative and not alternative.endswith("exoframe/")]
    assert len(named) >= 8
    missing = [name for name in named if not any(re.search(name, path) for path in paths)]
    assert not missing, f"step_overhead.py names paths no module has: {missing}"
    for module in ("rank.py", "packing.py"):  # the training loop's own frames
        assert any(step_overhead.IN_TRAINING.search(path) and path.endswith(module)
                   for path in paths)
