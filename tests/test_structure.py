"""The package's shape, read from its source with ast: the imports between exoframe's modules
(at the top of a module and inside its functions, relative ones resolved) form no cycle; the
ground floor (errors, inputs) imports nothing of exoframe; exoframe.sim imports nothing of
exoframe outside itself but the ground floor, and no torch; the wings of the engine and of the
simulator import one way; the experiments (sweeps, replays, executors) sit beside the engine,
which imports none of them, and only the command line imports them; strategies import nothing
from the config, the sinks or the report; no folder but strategies/ holds more than 15 modules;
no module is over 400 lines; no two modules share a file name (__init__.py and base.py aside);
the module paths benchmarks/step_overhead.py profiles by exist; no code sets an attribute on an
exception outside its class's __init__ or compares `type(...).__name__`; each text option is
parsed in its allowed places only, the Job declares its attributes and config.yaml is recorded
one way."""
from __future__ import annotations

import ast
import builtins
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_experiments_sit_beside_the_engine():
    """exoframe.experiments (sweeps, replays, executors, timelines: many runs, or a recorded
    one again) uses the engine (one run): the engine imports none of it, directly or through
    the modules it imports; nothing but the command line and the experiments themselves
    imports it; and it imports no command line."""
    inside, _ = import_graph()
    experiments = sorted(m for m in inside if m.startswith("exoframe.experiments."))
    assert len(experiments) >= 5  # (the package was found)
    for module in inside:
        if module == "exoframe.engine" or module.startswith("exoframe.engine."):
            bad = sorted(t for t in reachable(inside, module)
                         if t.startswith("exoframe.experiments"))
            assert not bad, f"{module} (the engine: one run) imports {bad}"
        elif not module.startswith(("exoframe.experiments", "exoframe.cli")):
            bad = sorted(t for t in inside[module] if t.startswith("exoframe.experiments"))
            assert not bad, f"{module} imports {bad}: only the command line imports experiments"
    for module in experiments:
        bad = sorted(t for t in reachable(inside, module) if t.startswith("exoframe.cli"))
        assert not bad, f"{module} imports {bad}, the command line above it"


def test_no_two_modules_share_a_file_name():
    """A module's file name says what it is about, once: no two modules of the package share
    one (a package's __init__.py and base.py aside), so a name in a traceback, a profile or
    a review is one module. (cli/'s command modules are named for their command:
    run_command.py; the module doing the work is named for its idea.)"""
    homes = {}
    for path in module_files().values():
        if path.name not in ("__init__.py", "base.py"):
            homes.setdefault(path.name, []).append(str(path.relative_to(PACKAGE.parent)))
    assert len(homes) > 100  # (the package was found)
    shared = {name: paths for name, paths in homes.items() if len(paths) > 1}
    assert not shared, f"modules sharing a file name: {shared}"


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


# -- exceptions declare their fields ------------------------------------------------------
BUILTIN_EXCEPTIONS = {name for name, value in vars(builtins).items()
                      if isinstance(value, type) and issubclass(value, BaseException)}


def _name(node) -> str | None:
    """The name an expression ends in: `Error` of `errors.Error`, `f` of `f`."""
    return node.id if isinstance(node, ast.Name) else \
        node.attr if isinstance(node, ast.Attribute) else None


def exception_kinds(trees: list) -> tuple[set, set]:
    """(the exception classes, builtin and defined in `trees`, by name; the functions that
    return one, by the name their return annotation gives)."""
    classes = set(BUILTIN_EXCEPTIONS)
    defined = [node for tree in trees for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef)]
    while True:  # (a subclass of a subclass: until no class is added)
        more = {c.name for c in defined if c.name not in classes
                and any(_name(base) in classes for base in c.bases)}
        if not more:
            break
        classes |= more
    makers = {node.name for tree in trees for node in ast.walk(tree)
              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns
              is not None and any(_name(n) in classes for n in ast.walk(node.returns))}
    return classes, makers


def exception_misuses(tree, classes: set, makers: set) -> list[tuple[int, str]]:
    """(line, what) for each place that sets an attribute on an exception outside its
    class's __init__ (an `except ... as e`, a parameter annotated as one, a variable given
    one, `self` in another method of an exception class), rewrites any `.args`, or compares
    `type(...).__name__`."""
    found = []
    exception_class_methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                               and c.name in classes for f in c.body
                               if isinstance(f, ast.FunctionDef) and f.name != "__init__"}

    def is_exception(value, names) -> bool:
        if isinstance(value, ast.Name):
            return value.id in names
        if isinstance(value, ast.Call):
            return _name(value.func) in classes | makers
        if isinstance(value, ast.IfExp):
            return is_exception(value.body, names) or is_exception(value.orelse, names)
        return False

    for function in [n for n in ast.walk(tree)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        names = {"self"} if id(function) in exception_class_methods else set()
        names |= {a.arg for a in [*function.args.args, *function.args.kwonlyargs]
                  if a.annotation is not None
                  and any(_name(n) in classes for n in ast.walk(a.annotation))}
        nodes = list(ast.walk(function))
        for _ in range(2):  # (a variable given one that another was given)
            for node in nodes:
                if isinstance(node, ast.ExceptHandler) and node.name:
                    names.add(node.name)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None \
                        and is_exception(node.value, names):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names |= {t.id for t in targets if isinstance(t, ast.Name)}
        for node in nodes:
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in [e for t in targets for e in
                               (t.elts if isinstance(t, ast.Tuple) else [t])]:
                    if isinstance(target, ast.Attribute) and (
                            target.attr == "args" or isinstance(target.value, ast.Name)
                            and target.value.id in names):
                        found.append((node.lineno, f"sets {ast.unparse(target)}"))
            elif isinstance(node, ast.Call) and _name(node.func) == "setattr" and node.args \
                    and is_exception(node.args[0], names):
                found.append((node.lineno, f"calls {ast.unparse(node.func)}"))
            elif isinstance(node, ast.Compare) and any(
                    isinstance(side, ast.Attribute) and side.attr == "__name__"
                    and isinstance(side.value, ast.Call) and _name(side.value.func) == "type"
                    for side in [node.left, *node.comparators]):
                found.append((node.lineno, f"compares {ast.unparse(node)}"))
    return sorted(set(found))


def test_finds_attributes_set_on_exceptions_and_type_name_comparisons():
    source = '''
class Stopped(ValueError):
    def __init__(self, rows):
        super().__init__("stopped")
        self.rows = rows  # (declared: fine)

    def later(self):
        self.status = "failed"

def interrupted() -> Stopped:
    return Stopped([])

def f(error: BaseException, job):
    error.args = ("amended",)
    job.steps = 3  # (not an exception: fine)
    made = Stopped([])
    made.names_checkpoint = True
    stop = made if job else interrupted()
    stop.rows = []
    try:
        pass
    except Exception as e:
        e.failed_rank = 1
        setattr(e, "details", "")
    return type(error).__name__ == "RunInterrupted"
'''
    tree = ast.parse(source)
    classes, makers = exception_kinds([tree])
    assert {"Stopped", "KeyboardInterrupt"} <= classes and makers == {"interrupted"}
    assert [line for line, _ in exception_misuses(tree, classes, makers)] == \
        [8, 14, 17, 19, 23, 24, 25]


def test_no_attribute_is_set_on_an_exception_after_it_is_made():
    """An exception declares its fields in its __init__ (exoframe/errors.py): code raises a
    new one, `from` the old, rather than amending one it caught; and an exit code or a
    branch is chosen by isinstance, not by a class's name."""
    trees = {path: ast.parse(path.read_text(), str(path)) for path in module_files().values()}
    classes, makers = exception_kinds(list(trees.values()))
    assert {"ExoframeError", "RunInterrupted", "RankFailed"} <= classes  # (found)
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
             for path, tree in trees.items()
             for line, what in exception_misuses(tree, classes, makers)]
    assert not found, "\n".join(found)


# Options parsed once. Each text option's parse function, and the only functions that may
# call it ("module:function"): the one call on a run's path (engine/plan/resolve.py, or
# resolve_sim, which resolve.py calls for the run's network, compute model and stragglers),
# and RunConfig.validate, which parses a value to refuse it early and keeps nothing of it.
PARSED_ONCE = {
    "parse_faults": {"exoframe.config:RunConfig.validate",
                     "exoframe.engine.plan.resolve:resolve_faults"},
    "budget_seconds": {"exoframe.config:RunConfig.validate",  # the time budget
                       "exoframe.engine.plan.resolve:resolve_time_budget"},
    "parse_partition": {"exoframe.config:RunConfig.validate",
                        "exoframe.engine.plan.resolve:partition_data"},
    "parse_stragglers": {"exoframe.sim.setup:resolve_sim"},
    # A sweep's --compute values compared as they read (fixed:10ms is fixed:0.01s) before
    # any run is resolved: its early check.
    "parse_compute": {"exoframe.sim.setup:resolve_sim",
                      "exoframe.experiments.sweep_axes:check_distinct"},
    # The network: the run's (resolve_sim); a bandwidth grid's copies of its base network,
    # and the `nets` and `emulate` commands, which read a network outside any run.
    "load_network": {"exoframe.sim.setup:resolve_sim",
                     "exoframe.experiments.sweep:grid_networks", "exoframe.cli.listings:nets",
                     "exoframe.cli.emulate_command:_network_file"},
    # A run's network, compute and stragglers together: resolve.py's one function for a
    # run, and the replays and timelines of a recorded trace through a network.
    "resolve_sim": {"exoframe.engine.plan.resolve:resolve_network",
                    "exoframe.experiments.run_replays:replay_run",
                    "exoframe.experiments.trace_events:_simulated",
                    "exoframe.testing:time_collective"},
}


def call_sites(name: str, modules: dict | None = None) -> list[str]:
    """'module:function' of every call of `name` (by name or as an attribute) in the
    package's modules, once per call: a function calling it twice is named twice."""
    sites = []
    for module, path in (module_files() if modules is None else modules).items():
        tree = ast.parse(path.read_text(), str(path))

        def visit(node, scope):
            for child in ast.iter_child_nodes(node):
                inner = scope
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    inner = f"{scope}.{child.name}" if scope else child.name
                if isinstance(child, ast.Call):
                    func = child.func
                    called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                    if called == name:
                        sites.append(f"{module}:{scope}")
                visit(child, inner)
        visit(tree, "")
    return sites


def test_call_sites_names_each_call_by_its_function(tmp_path):
    (tmp_path / "probe.py").write_text(
        "a(0)\n\n\ndef f(x):\n    a(x)\n    return [m.a(y) for y in x]\n\n\nclass C:\n"
        "    def g(self):\n        b = lambda: a(1)\n        return b, self.ab(2)\n")
    assert call_sites("a", {"probe": tmp_path / "probe.py"}) == [
        "probe:", "probe:f", "probe:f", "probe:C.g"]


@pytest.mark.parametrize("parse", sorted(PARSED_ONCE))
def test_each_option_is_parsed_in_its_allowed_places_once(parse):
    """Each text option (network, compute, stragglers, faults, time budget, partition) is
    parsed by one function, called only from the functions PARSED_ONCE names, once in each:
    on a run's path, by engine/plan/resolve.py, which makes the Job's typed value of it,
    and by RunConfig.validate, to refuse a bad value early; a sweep asks resolve.py's
    function (resolve_faults, resolve_network), the writers of config.yaml read the Job. A
    new call elsewhere parses the text a second way: read the Job's value, or name the new
    place here with its reason."""
    sites = call_sites(parse)
    assert len(sites) == len(set(sites)), f"{parse} is called twice in one function: {sites}"
    assert set(sites) == PARSED_ONCE[parse], (
        f"{parse} is called from {sorted(set(sites))}; only from {sorted(PARSED_ONCE[parse])}")


def test_the_job_declares_its_attributes_and_config_yaml_is_written_one_way():
    """No attribute of the Job is made by writing its __dict__ (each is a declared field or
    property, engine/plan/job.py); config.yaml's record is made by Job.config_record only,
    and written by engine/run.py only."""
    job = (PACKAGE / "engine" / "plan" / "job.py").read_text()
    assert "__dict__" not in job and "setattr" not in job
    assert call_sites("config_to_dict") == []  # (a config's fields, without what was resolved)
    assert {site.split(":")[0] for site in call_sites("write_config")} == {"exoframe.engine.run"}
    # The four ways a run starts, each recording its Job the one way (and a sweep's check
    # that no two of its points are one run, comparing those records).
    assert sorted(call_sites("config_record")) == [
        "exoframe.cli.run_command:run", "exoframe.engine.resume:resume",
        "exoframe.engine.trainer:Trainer.fit", "exoframe.experiments.executors:run_point",
        "exoframe.experiments.sweep_axes:SamePoints.add"]
