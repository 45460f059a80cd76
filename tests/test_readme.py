"""Every command README.md and the documentation (docs/**/*.md) show runs, shrunk to a few
steps, so neither can drift.

Each document is parsed at test time: a command added, changed or removed there is what runs
here (examples/quickstart.ipynb's commands too, from its Markdown cells; its code cells run in
tests/test_notebook.py). Each test is parametrised over the documents that show its kind of
block, so that none passes with nothing to check. A document's `exoframe` commands run through the CLI in one scratch folder of its own,
in the document's order (a later command may use an earlier one's output: `runs/<run>` is the
newest folder in runs/, `sweeps/<sweep>/runs/<run>` the newest run of the newest sweep), with
their training shrunk (--steps 3, a tiny gpt, no plots). The files a document supposes the
user has (their own network file, workload module, the examples/ folder) are made first; a
package it installs from a folder it made (`pip install ./exoframe-NAME`) is installed into
the scratch folder. Python blocks are executed with a tiny model and data, and the test_*
functions a block defines are called; a package a document writes out file by file (a block
under "`path/to/file.py`: ...") is built, installed and its tests run; YAML blocks must
load as a network or a run configuration (with the plugin hooks the document's Python
defines). The reference pages (docs/reference/) are made from the code and checked by
tests/test_docs.py.
"""
import dataclasses
import importlib.metadata
import os
import importlib.util
import json
import re
import shlex
import shutil
import socket
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO, SMALL_GPT_FLAGS, pip_install_into
from torch.utils.data import TensorDataset

import exoframe
from exoframe.config import RunConfig, resolve_config
from exoframe.plugins import PluginManager, get_plugin_manager
from exoframe.sim import resolve_sim

README = REPO / "README.md"
# Every document whose commands and code run here: README, then the docs' pages (the
# reference pages, made from the code, are tests/test_docs.py's).
DOCUMENTS = [README] + sorted(p for p in (REPO / "docs").rglob("*.md")
                              if "reference" not in p.relative_to(REPO / "docs").parts)
NOTEBOOK = REPO / "examples" / "quickstart.ipynb"  # (its Markdown cells' commands)
# The hf extra (transformers, datasets): README's commands that need it run where it is.
HF_EXTRA = all(importlib.util.find_spec(name) for name in ("transformers", "datasets"))
STEPS = "3"


def document_text(document: Path) -> str:
    """A document's Markdown: the file, or a notebook's Markdown cells."""
    if document.suffix == ".ipynb":
        cells = json.loads(document.read_text())["cells"]
        return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return document.read_text()


def code_blocks(language: str, document: Path = README):
    """The bodies of a document's ```language blocks (indented ones in list items too)."""
    pattern = re.compile(rf"^([ \t]*)```{language}[ \t]*\n(.*?)^\1```", re.M | re.S)
    return [re.sub(rf"^{m.group(1)}", "", m.group(2), flags=re.M)
            for m in pattern.finditer(document_text(document))]


def package_files(document: Path) -> dict:
    """{path: text} of the files a document writes out whole: each block right after a
    paragraph that starts with the file's path and a colon (`exoframe_x/strategy.py`: ...)."""
    pattern = re.compile(r"^`([\w.-]+(?:/[\w.-]+)*\.\w+)`:[^\n]*\n(?:[^\n]+\n)*\n"
                         r"```\w*[ \t]*\n(.*?)^```", re.M | re.S)
    return {m.group(1): m.group(2) for m in pattern.finditer(document_text(document))}


def is_package_test(block: str, document: Path) -> bool:
    """A test module of a package the document writes (its tests run in that package)."""
    return any(text == block and Path(path).name.startswith("test_")
               for path, text in package_files(document).items())


def ids(documents):
    return [str(p.relative_to(REPO)) for p in documents]


def shell_lines(block: str):
    """Logical lines: `\\` continuations joined, blank and comment-only lines dropped."""
    joined = re.sub(r"\\\n", " ", block)
    return [line.strip() for line in joined.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def simple_commands(line: str):
    """argv of each command in a line joined by ; && || (comments dropped)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands, current = [], []
    for token in lexer:
        if token in (";", "&&", "||"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    return [argv for argv in commands + [current] if argv]


# -- what README supposes the user already has --------------------------------------------

def make_user_files(cwd: Path):
    shutil.copytree(REPO / "examples", cwd / "examples")
    preset = (REPO / "netmodels" / "wan-100mbps.yaml").read_text()
    (cwd / "my-network.yaml").write_text(preset.replace("100mbit", "40mbit"))  # copied, edited
    package = cwd / "mypackage"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mymodule.py").write_text("from examples.my_workload import make as make_workload\n")
    (cwd / "wl").mkdir()
    shutil.copy(REPO / "examples" / "my_workload.py", cwd / "wl" / "mywl.py")
    data = cwd / "data"
    data.mkdir()
    tokens = np.random.default_rng(0).integers(0, 64, 60_000, dtype=np.uint16)
    tokens[:50_000].tofile(data / "train.bin")
    tokens[50_000:].tofile(data / "val.bin")
    text = "\n\n".join(document_text(document) for document in DOCUMENTS)
    (data / "input.txt").write_text(text)
    (cwd / "my-model").mkdir()
    (cwd / "my-model" / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 64}))
    if HF_EXTRA:
        import datasets

        datasets.Dataset.from_dict({"text": text.split("\n\n")}).save_to_disk(str(data / "corpus"))


# -- shrinking ---------------------------------------------------------------------------

def option(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


def with_option(argv, name, value):
    """argv with option `name` set to `value`: replaced where README gives it, else added."""
    if name in argv:
        i = argv.index(name)
        return argv[:i + 1] + [value] + argv[i + 2:]
    return argv + [name, value]


def workload_of(argv, cwd: Path):
    if option(argv, "--workload"):
        return option(argv, "--workload")
    config = option(argv, "--config")
    if config:
        return yaml.safe_load((cwd / config).read_text()).get("workload", "gpt")
    return "gpt"


def fill_placeholders(arg: str, cwd: Path):
    """`runs/<run>`: the newest entry of cwd/runs; `sweeps/<sweep>/runs/<run>`: the newest
    run of the newest sweep (each placeholder in turn, left to right)."""
    while (match := re.search(r"<\w+>", arg)):
        parent = arg[:match.start()]
        folder = cwd / parent
        entries = sorted(folder.iterdir(), key=lambda p: p.stat().st_mtime_ns) \
            if folder.is_dir() else []
        assert entries, f"{arg}: nothing in {parent} yet"
        arg = f"{parent}{entries[-1].name}{arg[match.end():]}"
    return arg


def shrink(argv, cwd: Path):
    """`exoframe ...` as README gives it, made small: few steps, a tiny gpt, no plots."""
    args = [fill_placeholders(a, cwd) for a in argv[1:]]
    command = args[0] if args else None
    if command in ("run", "sweep"):
        args = with_option(args, "--steps", STEPS)
        if "--warmup-steps" in args:  # fewer than the steps, as a run requires
            args = with_option(args, "--warmup-steps", "1")
        if workload_of(args, cwd) in ("gpt", "hf-lm"):
            args += SMALL_GPT_FLAGS if workload_of(args, cwd) == "gpt" else [
                "-w", "train_tokens=40000", "-w", "val_tokens=4000"]
    if "--checkpoint-every" in args:  # a checkpoint before the last step, to resume from
        args = with_option(args, "--checkpoint-every", str(int(STEPS) - 1))
    if command == "resume" and "--steps" in args:
        args = with_option(args, "--steps", str(int(STEPS) + 2))
    if command == "sweep" and "--points" in args:
        args = with_option(args, "--points", "2")
    if command == "sweep" or (command == "report" and "--format" not in args):
        args += ["--no-plots"]  # (a report that names formats shows its figures)
    return args


# -- what each command must leave behind ---------------------------------------------------

def printed_path(stdout: str, label: str, cwd: Path) -> Path:
    """The folder a command reports, e.g. `run folder  runs/...` or `wrote exoframe-x`."""
    match = re.search(rf"{label}:?\s+(\S+)", stdout)
    assert match, f"no '{label}' line in the output:\n{stdout[-1000:]}"
    return cwd / match.group(1)


def check_run(args, stdout, cwd):
    run_dir = printed_path(stdout, "run folder", cwd)
    summary = json.loads((run_dir / "summary.json").read_text())
    if option(args, "--nodes"):
        assert summary["num_nodes"] == int(option(args, "--nodes")), summary["num_nodes"]
    sinks = [name for i in range(1, len(args)) if args[i - 1] == "--sink"
             for name in ([args[i]] if ":" in args[i] else args[i].split(","))] or ["jsonl"]
    for sink in sinks:
        name, _, options = sink.partition(":")
        logdir = dict(o.split("=", 1) for o in options.split(",") if o).get("logdir")
        written = {"tensorboard": logdir or "tensorboard",
                   "wandb": "wandb"}.get(name, f"metrics.{name}")
        assert (run_dir / written).exists(), f"no {written} in {run_dir} (sink {sink})"
        if name == "tensorboard":  # the events of this run, in its folder, not one below
            assert list((run_dir / written).glob("events.out.tfevents.*")), run_dir
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert 1 <= len(rows) <= int(STEPS), f"{len(rows)} metrics rows for --steps {STEPS}"


def check_resume(args, stdout, cwd):
    run_dir = printed_path(stdout, "run folder", cwd)
    steps = json.loads((run_dir / "summary.json").read_text())["steps"]
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(row)["step"] for row in rows] == list(range(1, steps + 1)), rows
    assert steps == int(option(args, "--steps") or STEPS), steps


def check_sweep(args, stdout, cwd):
    sweep_dir = printed_path(stdout, "sweep folder", cwd)
    rows = json.loads((sweep_dir / "sweep.json").read_text())
    assert rows, "an empty sweep.json"
    if option(args, "--strategy"):
        assert {r["strategy"] for r in rows} == set(option(args, "--strategy").split(",")), rows
    if "--faults" in args:  # one setting of simulated failures per --faults
        assert len({r["faults"] for r in rows}) == args.count("--faults"), rows
    configs = [yaml.safe_load((d / "config.yaml").read_text())
               for d in (sweep_dir / "runs").iterdir()]
    for flag, field in (("--partition", "partition"), ("--seeds", "seed")):
        if option(args, flag):  # an axis: a run of each value, which its config records
            assert {str(c[field]) for c in configs} == set(option(args, flag).split(",")), flag


def check_replay(args, stdout, cwd):
    replays = [json.loads(p.read_text()) for p in (cwd / args[1] / "replays").glob("*.json")]
    assert option(args, "--net") in [r["net"] for r in replays], "no replay through --net saved"


def check_report(args, stdout, cwd):
    out = cwd / option(args, "--out") if option(args, "--out") else None
    for name in ("sweep.json", "speedup.csv", "utilization.csv") if out else ():
        assert (out / name).exists(), f"no {name} in --out"
    if option(args, "--baseline"):
        assert f"speed-up vs {option(args, '--baseline')}" in stdout, stdout[-1000:]
    for form in (option(args, "--format").split(",") if out and option(args, "--format")
                 else ()):
        assert (out / f"speedup_vs_bandwidth.{form}").exists(), f"no {form} figure"
        if "--paper" in args:
            assert (out / "speedup_vs_bandwidth.caption.txt").read_text().strip()


def check_new_plugin(args, stdout, cwd):
    assert (printed_path(stdout, "wrote", cwd) / "pyproject.toml").exists(), "no package"


def check_listing(args, stdout, cwd):
    assert stdout.strip(), "printed nothing"
    if "--json" in args:
        json.loads(stdout)


CHECKS = {"run": check_run, "resume": check_resume, "sweep": check_sweep, "replay": check_replay,
          "report": check_report, "new-plugin": check_new_plugin}


# -- the commands -------------------------------------------------------------------------

@dataclasses.dataclass
class Command:
    line: str   # README's line, as written
    argv: list


def document_commands(document: Path):
    return [Command(line, argv) for block in code_blocks("bash", document)
            for line in shell_lines(block) for argv in simple_commands(line)]


def readme_commands():
    """The commands of README and every docs page (tests/test_emulate.py runs their
    `sudo exoframe emulate` lines)."""
    return [command for document in DOCUMENTS for command in document_commands(document)]


# The documents that show commands: README, the docs' pages with a bash block, the notebook.
COMMAND_DOCUMENTS = [d for d in DOCUMENTS + [NOTEBOOK] if document_commands(d)]


# Example scripts README runs, and the flags that make them small.
EXAMPLE_SHRINK = {"examples/exogym_nanogpt.py": ["--max_steps", STEPS, "--val_interval", STEPS,
                                                 "--warmup_steps", "1"],
                  "examples/rpc_data_parallel.py": ["--steps", STEPS]}


def not_rerun_here(argv):
    """Why a non-exoframe command is not run here, or None when the test cannot place it."""
    if argv[0] == "pip" or argv[:2] == ["python", "-c"]:
        return "installs (or checks for) packages"
    if argv[:3] == ["python", "-m", "pytest"] and argv[3:] == ["-q", "tests", "plugins"]:
        return "runs this suite; .ci/run holds it verbatim (checked)"
    if argv[:3] == ["python", "-m", "pytest"] and argv[3:4] and \
            argv[3].startswith("exoframe-"):
        return "a plugin skeleton's tests: tests/test_plugins.py runs them"
    if argv[:2] == ["mkdocs", "build"]:
        return ("builds the site: tests/test_docs.py runs README's `mkdocs build` (skipped, "
                "saying so, where the docs extra is not installed)")
    if argv[:2] == ["python", "benchmarks/emulated_network.py"]:
        return "needs root; tests/test_emulated_network.py runs its smallest case"
    if argv[:3] == ["sudo", "exoframe", "emulate"]:
        return "needs root; tests/test_emulate.py runs README's emulate lines, shrunk"
    if argv[:3] == ["python", "-m", "exoframe.emulation.physics"]:
        return "needs root; tests/test_delay_line.py makes the same checks"
    return None


def run_torchrun(argv, cli) -> str | None:
    """A torchrun line: its --nnodes agents, all on this machine with the rendezvous on
    loopback (HOST), the exoframe command shrunk; what failed, or None."""
    at = argv.index("-m")
    flags, args = argv[1:at], shrink(argv[at + 1:], cli.cwd)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if "--rdzv-endpoint" in flags:
        flags = with_option(flags, "--rdzv-endpoint", f"127.0.0.1:{port}")
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *flags, "-m",
                                "exoframe", *args], cwd=cli.cwd, env=cli.env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(int(option(flags, "--nnodes") or 1))]
    outputs = [agent.communicate(timeout=300) for agent in agents]  # a hang guard
    failed = [(agent.returncode, err) for agent, (_, err) in zip(agents, outputs)
              if agent.returncode]
    if failed:
        return f"exit {failed[0][0]}: {failed[0][1][-1500:]}"
    try:
        CHECKS[args[0]](args, "".join(out for out, _ in outputs), cli.cwd)
    except AssertionError as e:
        return f"ran: exoframe {shlex.join(args)}\n  {e}"
    return None


def install_local_package(argv, cwd: Path) -> str | None:
    """`pip install [-e] ./FOLDER` of a package the document made (exoframe new-plugin):
    installed into cwd/site, as pip installs it; the site folder, or None for any other pip
    command (the repository's plugins are installed already: CI installs them)."""
    folders = [a for a in argv[2:] if not a.startswith("-")]
    if argv[:2] != ["pip", "install"] or len(folders) != 1 or not (cwd / folders[0]).is_dir():
        return None
    site = cwd / "site"
    done = pip_install_into(site, cwd / folders[0])
    assert done.returncode == 0, done.stderr[-1500:]
    return str(site)


# Commands run two at a time (one per core): most of each is start-up. A command that
# reads an earlier one's output (`runs/<run>`) waits for all before it, and runs alone.
BATCH = 2


@pytest.mark.parametrize("document", COMMAND_DOCUMENTS, ids=ids(COMMAND_DOCUMENTS))
def test_every_command_of_the_document_runs_shrunk(cli, document):
    commands = document_commands(document)
    if document == README:
        assert any(c.argv == ["exoframe", "run"] for c in commands), "README's set-up run is gone"
    make_user_files(cli.cwd)
    failures, running = [], []
    ran = []  # the lines of the commands run here (not those another test runs)
    sites = []  # packages the document installed: later commands run in a fresh interpreter

    def start(args):
        if not sites:
            return cli.start(*args)
        path = os.pathsep.join([*sites, cli.env()["PYTHONPATH"]])
        return cli.popen(*args, env={"PYTHONPATH": path})

    def finish_all():
        try:
            for command, args, proc in running:
                stdout, stderr = proc.communicate(timeout=300)  # a hang guard, not a speed limit
                try:
                    assert proc.returncode == 0, f"exit {proc.returncode}: {stderr[-1500:]}"
                    CHECKS.get(args[0], check_listing)(args, stdout, cli.cwd)
                except Exception as e:  # noted, and the other commands still run
                    failures.append(f"{command.line}\n  ran: exoframe {shlex.join(args)}\n"
                                    f"  {type(e).__name__}: {e}")
        finally:
            for _, _, proc in running:
                proc.kill()
                proc.wait()
            running.clear()

    for command in commands:
        if command.argv[:1] == ["python"] and command.argv[1] in EXAMPLE_SHRINK:
            ran.append(command.line)
            example = subprocess.run(
                [sys.executable, *command.argv[1:], *EXAMPLE_SHRINK[command.argv[1]]],
                cwd=cli.cwd, env=cli.env(), capture_output=True, text=True, timeout=300)
            if example.returncode != 0:
                failures.append(f"{command.line}\n  exit {example.returncode}: "
                                f"{example.stderr[-1500:]}")
            continue
        if command.argv[0] == "torchrun":
            finish_all()
            failure = run_torchrun(command.argv, cli)
            ran.append(command.line)
            if failure:
                failures.append(f"{command.line}\n  {failure}")
            continue
        if command.argv[0] == "pip":
            finish_all()  # (the package it installs may be one a command before it made)
            try:
                site = install_local_package(command.argv, cli.cwd)
            except AssertionError as e:
                failures.append(f"{command.line}\n  {e}")
                continue
            sites += [site] if site else []
            ran += [command.line] if site else []
            continue
        if command.argv[0] != "exoframe":
            if not_rerun_here(command.argv) is None:
                failures.append(f"{command.line}\n  test_readme cannot run {command.argv[0]!r}")
            continue
        if not HF_EXTRA and any(a == "hf-lm" or a.endswith("data/corpus") for a in command.argv):
            continue  # needs the hf extra, not installed here (CI installs it)
        reads_earlier_output = any(re.search(r"<\w+>", a) for a in command.argv)
        if reads_earlier_output or len(running) == BATCH:
            finish_all()
        try:
            args = shrink(command.argv, cli.cwd)
        except AssertionError as e:
            failures.append(f"{command.line}\n  {e}")
            continue
        running.append((command, args, start(args)))
        ran.append(command.line)
        if reads_earlier_output:
            finish_all()
    finish_all()
    assert not failures, f"{document.name}: commands that fail:\n\n" + "\n\n".join(failures)
    assert ran, f"{document.name}: none of its commands runs here"
    assert cli.leftovers() == []


def test_the_set_up_command_installs_what_a_first_sweep_plots_with():
    """`exoframe sweep` draws plots unless told --no-plots, and refuses to start without
    matplotlib: README's first command installs the extra that brings it."""
    from packaging.requirements import Requirement

    setup = next(c.argv for c in document_commands(README) if c.argv[:3] == ["pip", "install", "-e"])
    extras = re.findall(r"[\w-]+", setup[3].partition("[")[2])  # ".[plot,hf]": plot, hf
    installed = set()
    for line in importlib.metadata.requires("exoframe"):
        requirement = Requirement(line)
        if requirement.marker is None or any(requirement.marker.evaluate({"extra": extra})
                                             for extra in extras):
            installed.add(requirement.name)
    assert "matplotlib" in installed, f"README's set-up installs {shlex.join(setup[2:])}"


def test_ci_runs_readmes_test_command_verbatim():
    tests = [c.line for c in document_commands(README)
             if c.argv[:3] == ["python", "-m", "pytest"]]
    assert tests, "README shows no test command"
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    for line in tests:
        assert line in ci, f".ci/run does not hold README's test command:\n{line}"


def test_readmes_figures_are_what_its_comparison_makes():
    """README's comparison is the sweep examples/compare.sh runs to make the figures README
    shows, and those figures are in the repository."""
    sweep = next(c.line for c in document_commands(README) if c.argv[:2] == ["exoframe", "sweep"])
    script = (REPO / "examples" / "compare.sh").read_text()
    assert f"{sweep} --out" in script, "examples/compare.sh does not run README's sweep"
    shown = re.findall(r"(?:\]\(|src=\")(docs/figures/[\w.-]+)", README.read_text())
    assert len(shown) >= 2 and all((REPO / path).is_file() for path in shown), shown
    assert all(path in script for path in shown), "a figure README shows is not compare.sh's"


def document_hooks(document: Path) -> dict:
    """The plugin hooks (exoframe_register_*) the document's Python blocks define."""
    hooks = {}
    for block in code_blocks("python", document):
        if "@exoframe.hookimpl" in block:
            names = {}
            exec(compile(block, f"{document.name} python block", "exec"), names)
            hooks.update({k: v for k, v in names.items() if k.startswith("exoframe_register_")})
    return hooks


YAML_DOCUMENTS = [d for d in DOCUMENTS if code_blocks("yaml", d)]


@pytest.mark.parametrize("document", YAML_DOCUMENTS, ids=ids(YAML_DOCUMENTS))
def test_every_yaml_block_is_a_network_or_a_run_config(tmp_path, document):
    blocks = code_blocks("yaml", document)
    plugins = get_plugin_manager()
    hooks = document_hooks(document)
    if hooks:  # (an algorithm the document writes, which its network file names)
        plugins = PluginManager()
        plugins.register(types.SimpleNamespace(**hooks), name=document.stem,
                         source=document.name)
    for i, block in enumerate(blocks):
        path = tmp_path / f"block{i}.yaml"
        path.write_text(block)
        values = yaml.safe_load(block)
        if set(values) & {f.name for f in dataclasses.fields(RunConfig)}:
            resolve_config(str(path))
        else:  # (on 4 nodes, or as many as the ranks its sites list)
            listed = [r for site in (values.get("sites") or {}).values()
                      for r in (site or {}).get("ranks") or []]
            resolve_sim(str(path), "measured", "", max([3, *listed]) + 1, plugins)


def test_the_documents_show_yaml_and_python():
    """(The tests here run what the documents show: that they show some is checked here.)"""
    assert YAML_DOCUMENTS and README in COMMAND_DOCUMENTS and NOTEBOOK in COMMAND_DOCUMENTS
    assert {README, REPO / "docs" / "plugins.md", REPO / "docs" / "strategies.md"} <= \
        set(PYTHON_DOCUMENTS)
    assert PACKAGE_DOCUMENTS, "no document writes out a plugin package any more"


def test_the_sites_front_page_installs_as_readme_does():
    """docs/index.md's set-up line is README's (the site's front page shows no other)."""
    index = [c.line for c in document_commands(REPO / "docs" / "index.md")]
    assert index and set(index) <= {c.line for c in document_commands(README)}, index


# -- Python blocks ------------------------------------------------------------------------

class LinearRegression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self.linear(x).squeeze(1), y)


def regression_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0]))


PYTHON_DOCUMENTS = [d for d in DOCUMENTS if code_blocks("python", d)]
# The documents that write out a package, file by file (docs/plugins.md: a strategy plugin).
PACKAGE_DOCUMENTS = [d for d in DOCUMENTS
                     if any(Path(path).name.startswith("test_") for path in package_files(d))]


@pytest.mark.parametrize("document", PYTHON_DOCUMENTS, ids=ids(PYTHON_DOCUMENTS))
def test_every_python_block_runs_shrunk(document):
    """Each block runs (a package's test modules run in that package: the test below), with
    `model`, `train_dataset` and `val_dataset` a user has; a strategy a block writes trains,
    and the test_* functions it defines are called, as pytest would."""
    for block in code_blocks("python", document):
        if is_package_test(block, document):
            continue
        source = re.sub(r"\bsteps=\d+", f"steps={STEPS}", block)
        model = LinearRegression()
        names = dict(model=model, train_dataset=regression_data(256, 0),
                     val_dataset=regression_data(64, 1))
        exec(compile(source, f"{document.name} python block", "exec"), names)
        if "result" in names:  # a training run: the API's result is what README says
            result = names["result"]
            assert result.model is not model  # a copy of it, trained; `model` as given
            assert result.summary["steps"] == int(STEPS) and len(result.metrics) == int(STEPS)
        strategies = [v for v in names.values() if isinstance(v, type)  # (written here)
                      and issubclass(v, exoframe.Strategy)
                      and re.search(rf"^class {v.__name__}\b", source, re.M)]
        hooks = [v for k, v in names.items() if k.startswith("exoframe_register_")]
        for strategy in strategies:  # a strategy a document writes trains and communicates
            registered = []
            for hook in hooks:
                hook(lambda *registration: registered.extend(registration))
            assert not hooks or strategy in registered, f"{strategy} is not registered"
            trainer = exoframe.Trainer(LinearRegression(), regression_data(256, 0),
                                       regression_data(64, 1), batch_size=16)
            summary = trainer.fit(strategy=strategy, num_nodes=2, steps=20).summary
            assert summary["steps"] == 20 and summary["bytes_sent_per_node"] > 0, summary
        for name, test in list(names.items()):  # a test the block writes: it passes
            if name.startswith("test_") and callable(test):
                test()


@pytest.mark.parametrize("document", PACKAGE_DOCUMENTS, ids=ids(PACKAGE_DOCUMENTS))
def test_the_package_a_document_writes_installs_and_passes_its_tests(tmp_path, document):
    """The files a document writes out whole (a block under "`path`: ..."), as a package:
    installed as `pip install` installs it (into a folder of its own), its tests run with
    pytest in a fresh interpreter, as the document's `python -m pytest` runs them."""
    package = tmp_path / "package"
    for path, text in package_files(document).items():
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text(text)
    assert (package / "pyproject.toml").is_file(), f"{document.name} writes no pyproject.toml"
    installed = pip_install_into(tmp_path / "site", package)
    assert installed.returncode == 0, installed.stderr[-1500:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path / "site"), str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(package / "tests")], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)  # a hang guard
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-1500:]
    assert " passed" in tests.stdout and " failed" not in tests.stdout, tests.stdout
