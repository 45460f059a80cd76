import compileall
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from exoframe.testing import TinyRegression

REPO = Path(__file__).resolve().parent.parent

# A gpt workload small enough for tests: as workload parameters, and as CLI flags.
SMALL_GPT = dict(n_layer=1, n_embd=32, block_size=32, train_tokens=40000, val_tokens=4000)
SMALL_GPT_FLAGS = [arg for key, value in SMALL_GPT.items() for arg in ("-w", f"{key}={value}")]


def pytest_sessionstart(session):
    """The suite starts hundreds of `python -m exoframe` processes. Each reads exoframe's
    bytecode from __pycache__ (ignored by git) instead of compiling every module it imports:
    where PYTHONDONTWRITEBYTECODE is set (CI), nothing would write it otherwise."""
    compileall.compile_dir(REPO / "exoframe", quiet=1)


# Every run folder a test writes (a folder holding a summary.json that exoframe wrote, which
# says its schema_version, under the temporary folders made while the test was set up and
# ran: its tmp_path, and tmp_path_factory's folders made by the fixtures it set up) is
# checked after the test passes: each record against the JSON Schemas the package ships
# (exoframe.schema.validate_run_folder). An invalid one fails the test, one line per problem.
# A summary.json without schema_version is one a test wrote by hand (the reports read what
# scripts write, with only some of the fields): not checked. A test that breaks exoframe's
# records on purpose is marked `invalid_records`; EXOFRAME_TEST_CHECK_RECORDS=0 turns the
# check off (to time it).
INVALID_RECORDS = "invalid_records"
SKIPPED_IN_WALK = {"__pycache__", "site-packages", "node_modules"}
_BEFORE_SETUP = pytest.StashKey[set]()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"{INVALID_RECORDS}: the test writes run folders with broken records on "
                   "purpose: they are not checked against the schemas after it")


def records_checked() -> bool:
    return os.environ.get("EXOFRAME_TEST_CHECK_RECORDS", "1") != "0"


def _temporary_root(config):
    """tmp_path_factory's base folder where this session has made it yet, else None (it is
    not made here only to be looked at)."""
    factory = getattr(config, "_tmp_path_factory", None)
    base = getattr(factory, "_basetemp", None)
    return Path(base) if base is not None else None


def _entries(folder) -> set:
    try:
        return set(os.listdir(folder)) if folder is not None else set()
    except OSError:
        return set()


def written_by_exoframe(summary: Path) -> bool:
    """Whether summary.json is exoframe's (it says its schema_version), not a test's own."""
    try:
        return b'"schema_version"' in summary.read_bytes()
    except OSError:
        return False


def run_folders_in(roots) -> list:
    """The run folders exoframe wrote (holding its summary.json) in and under each of
    `roots` (a link is not followed: pytest's `...current` links name folders walked too)."""
    found = set()
    for root in roots:
        if Path(root).is_symlink():
            continue
        for folder, subfolders, files in os.walk(root):
            subfolders[:] = [name for name in subfolders
                             if not name.startswith(".") and name not in SKIPPED_IN_WALK]
            if "summary.json" in files and written_by_exoframe(Path(folder) / "summary.json"):
                found.add(Path(folder))
    return sorted(found)


def check_run_folders(roots, what: str = "the test") -> None:
    """Fail (pytest.fail) with one line per problem when a run folder in or under `roots`
    does not validate against the shipped schemas."""
    from exoframe.schema import validate_run_folder

    problems = [line for folder in run_folders_in(roots) for line in validate_run_folder(folder)]
    if problems:
        pytest.fail(f"a run folder {what} wrote does not validate against exoframe's JSON "
                    f"Schemas (mark the test `{INVALID_RECORDS}` if that is its point):\n"
                    + "\n".join(problems), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    item.stash[_BEFORE_SETUP] = _entries(_temporary_root(item.config))
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield  # (a test that failed is not checked: its own failure is reported)
    if not records_checked() or item.get_closest_marker(INVALID_RECORDS) is not None:
        return result
    roots = set()
    base = _temporary_root(item.config)
    if base is not None:  # the folders made since the test's set-up began
        roots.update(base / name for name in _entries(base) - item.stash.get(_BEFORE_SETUP, set()))
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if tmp_path is not None:
        roots.add(Path(tmp_path))
    check_run_folders(sorted(roots))
    return result


def processes_with_marker(marker: str, groups=()) -> list:
    """PIDs of live processes whose environment carries `marker` (ranks inherit it, as does
    whatever a command execs) or whose process group is one of `groups` (what a command the
    command server forked forks in turn)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = next(l for l in (entry / "status").read_text().splitlines()
                         if l.startswith("State:"))
            # (the name, in parentheses, may hold spaces: the fields after it are split)
            group = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
        except (OSError, StopIteration):
            continue
        if (marker.encode() in environ or group in groups) and "zombie" not in state:
            found.append(int(entry.name))
    return sorted(found)


class CommandServer:
    """The client of tests/cli_server.py: a process that has imported torch and exoframe,
    started once per session, which forks each command a test runs to completion."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "cli_server.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, "PYTHONPATH": str(REPO)})
        self.ids = itertools.count()
        self.folder = Path(tempfile.mkdtemp(prefix="exoframe-cli-"))  # the commands' output
        self.answers: dict[int, dict] = {}
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for line in self.proc.stdout:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # (not an answer: the server writes answers only)
                with self.changed:
                    self.answers.setdefault(message["id"], {}).update(message)
                    self.changed.notify_all()
        finally:
            with self.changed:
                self.answers[-1] = {"gone": True}
                self.changed.notify_all()

    def _await(self, request_id: int, key: str, deadline: float):
        with self.changed:
            while key not in self.answers.get(request_id, {}):
                if -1 in self.answers:
                    raise RuntimeError("tests/cli_server.py stopped")
                if not self.changed.wait(timeout=max(0.0, deadline - time.monotonic())):
                    return None
            return self.answers[request_id][key]

    def start(self, args: list, cwd: Path, env: dict) -> "ServedCommand":
        request_id = next(self.ids)
        out, err = (self.folder / f"{request_id}.{name}" for name in ("out", "err"))
        request = dict(id=request_id, args=args, cwd=str(cwd), env=env, stdout=str(out),
                       stderr=str(err))
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        pid = self._await(request_id, "pid", time.monotonic() + 120)
        if pid is None:
            raise RuntimeError("tests/cli_server.py did not start a command in 120 s")
        return ServedCommand(self, request_id, args, pid, out, err)

    def close(self):
        self.proc.stdin.close()  # (it stops at the end of its input)
        self.proc.wait(timeout=60)
        shutil.rmtree(self.folder, ignore_errors=True)


_server = None


def helper_processes() -> set:
    """The suite's own children that outlive a test (the command server)."""
    return {_server.proc.pid} if _server is not None else set()


def pytest_sessionfinish(session):
    if _server is not None:
        _server.close()


def command_server() -> CommandServer:
    global _server
    if _server is None:
        _server = CommandServer()
    return _server


class ServedCommand:
    """A command the server forked, as much of a Popen as the tests use."""

    def __init__(self, server: CommandServer, request_id: int, args: list, pid: int,
                 out: Path, err: Path):
        self.server, self.request_id, self.args, self.pid = server, request_id, args, pid
        self.out, self.err = out, err
        self.returncode = None

    def wait(self, timeout=None):
        deadline = time.monotonic() + (timeout if timeout is not None else 10 ** 6)
        code = self.server._await(self.request_id, "returncode", deadline)
        if code is None:
            raise subprocess.TimeoutExpired(["exoframe", *self.args], timeout)
        self.returncode = code
        return code

    def communicate(self, timeout=None):
        """(stdout, stderr) once it ended; killed (its group) if it outlasts `timeout`."""
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait(60)
            raise
        texts = [path.read_text(errors="replace") for path in (self.out, self.err)]
        for path in (self.out, self.err):
            path.unlink(missing_ok=True)
        self.stdout_text, self.stderr_text = texts
        return tuple(texts)

    def kill(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class CLI:
    """Runs `exoframe ...` commands: to completion in a child of the command server
    (CommandServer, its own process group), or in a `python -m exoframe` subprocess
    tagged with a unique marker (popen, or a command with its own environment)."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.marker = f"EXOFRAME_TEST_{uuid.uuid4().hex}"
        self.groups: list[int] = []  # of the commands the server ran

    def env(self, extra=None):
        env = dict(os.environ)
        env[self.marker] = "1"
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO), str(self.cwd), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        # The wandb sink (README runs it): offline, its files here, no error reports sent.
        home = self.cwd / ".wandb-home"
        env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_ERROR_REPORTING="false",
                   WANDB_CONFIG_DIR=str(home / "config"), WANDB_CACHE_DIR=str(home / "cache"),
                   WANDB_DATA_DIR=str(home / "data"))
        env.update(extra or {})
        return env

    def popen(self, *args, env=None, **kw):
        return subprocess.Popen([sys.executable, "-m", "exoframe", *map(str, args)], cwd=self.cwd,
                                env=self.env(env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, **kw)

    def __call__(self, *args, env=None, timeout=120):
        if env is not None:  # (read at start-up by torch and Python: a fresh interpreter)
            proc = self.popen(*args, env=env)
            out, err = proc.communicate(timeout=timeout)
            proc.stdout_text, proc.stderr_text = out, err
            return proc
        proc = self.start(*args)
        proc.communicate(timeout=timeout)
        return proc

    def start(self, *args) -> ServedCommand:
        """`exoframe ARGS` forked by the command server (no start-up imports to pay)."""
        proc = command_server().start(list(map(str, args)), self.cwd, self.env())
        self.groups.append(proc.pid)
        return proc

    def leftovers(self):
        """The live processes this CLI's commands started, theirs included."""
        return processes_with_marker(self.marker, self.groups)


@pytest.fixture
def cli(tmp_path):
    return CLI(tmp_path)


def write_plugin(folder: Path, dist: str, module: str, source: str, version: str = "0.1.0"):
    """A third-party-style plugin on `folder` (put on sys.path): a module plus the dist-info
    that importlib.metadata reads, with an entry point in group `exoframe`. This is what
    `pip install` leaves behind, without the install."""
    (folder / f"{module}.py").write_text(source)
    info = folder / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[exoframe]\n{module} = {module}\n")


def pip_install_into(site: Path, package: Path) -> subprocess.CompletedProcess:
    """`pip install PACKAGE` as a user runs it, into the folder `site` (put it on PYTHONPATH):
    no dependencies, no index, no build isolation (setuptools is the dev extra's), so it
    works offline and leaves the environment as it was."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(site), str(package)], capture_output=True, text=True)


# A tiny MLP regressor whose forward(batch) returns the MSE loss: the testing kit's.
Regressor = TinyRegression


CRASHY = textwrap.dedent('''
    import exoframe
    from exoframe.strategies import DDP

    class Crashy(DDP):
        """Fails on rank 1 at step {step}."""
        def step(self):
            if self.rank == 1 and self.step_num == {step}:
                raise RuntimeError("boom on rank one")
            super().step()

    @exoframe.hookimpl
    def exoframe_register_strategies(register):
        register("crashy", Crashy)
''')


def write_crashy_plugin(folder: Path, step: int):
    """A plugin strategy `crashy`: ddp whose rank 1 raises RuntimeError at `step`."""
    write_plugin(folder, "crashy-plugin", "crashy", CRASHY.format(step=step))


def one_line_error(capsys, *args):
    """Run the CLI in-process on bad input: exit 2 with one line on stderr, returned."""
    from exoframe.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(map(str, args)))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    return err


HANG_GUARD = 120  # seconds; a guard against hangs, never a speed requirement

# The mlp workload, whose training forward hangs after EXOFRAME_TEST_HANG_AFTER calls (the
# run is then surely between its checkpoint and its end when the launcher is killed), and
# sleeps EXOFRAME_TEST_SLOW seconds in each (a run still going when it is signalled), and
# waits while the file EXOFRAME_TEST_GATE exists once past EXOFRAME_TEST_GATE_AFTER calls (a
# run held until the test lets it go).
HANGING_WORKLOAD = '''
import dataclasses
import os
import time

import torch

from exoframe.workloads.mlp import mlp


class Hangs(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, batch):
        if self.training:
            self.calls += 1
            limit = os.environ.get("EXOFRAME_TEST_HANG_AFTER")
            if limit and self.calls > int(limit):
                time.sleep(3600)
            time.sleep(float(os.environ.get("EXOFRAME_TEST_SLOW", 0)))
            gate = os.environ.get("EXOFRAME_TEST_GATE")
            after = int(os.environ.get("EXOFRAME_TEST_GATE_AFTER", 0))
            if gate and self.calls > after and os.path.exists(gate):
                open(gate + ".reached", "w").close()
            while gate and self.calls > after and os.path.exists(gate):
                time.sleep(0.01)
        return self.inner(batch)


def workload(**params):
    inner = mlp(**params)
    return dataclasses.replace(inner, build_model=lambda: Hangs(inner.build_model()),
                               metrics=None)
'''


def only_run(folder):
    (run,) = folder.iterdir()
    return run


def wait_for(condition, what):
    """Poll until `condition()`; the deadline only keeps a hung run from hanging the suite."""
    deadline = time.monotonic() + HANG_GUARD
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"hang guard: {what} never came")
        time.sleep(0.05)


def metric_lines(run):
    path = run / "metrics.jsonl"
    return path.read_text().splitlines() if path.exists() else []
