"""A process that has imported torch and exoframe once and forks each `exoframe` command the
tests run to completion (conftest.CLI.__call__), so that no command pays the second and a
half of imports a fresh interpreter does (torch, torch._dynamo, the engine).

Each command's child becomes what `python -m exoframe ARGS` would be: its own process group
(by which the tests find what it leaves behind), the test's folder, environment, sys.path and
argv, its output in files, then exoframe's own entry point. Requests come one JSON object a
line on stdin: {"id", "args", "cwd", "env", "stdout", "stderr"}; the server answers on
stdout {"id", "pid"} once forked and {"id", "returncode"} once reaped (negative: the signal
that ended it), as subprocess does.

What the server fixed at its own start stays the server's: the hash seed, and what torch
read of the environment when it was imported (OMP_NUM_THREADS, ...). A command that needs
those of its own runs in a fresh interpreter (conftest.CLI: a command given `env=`).
"""
import json
import os
import select
import signal
import sys
import traceback

sys.path[:] = [p for p in sys.path if p not in ("", os.path.dirname(__file__))]

import torch  # noqa: E402,F401
import torch._dynamo  # noqa: E402,F401
import exoframe.cli  # noqa: E402
import exoframe.engine.run  # noqa: E402,F401
import exoframe.experiments.sweep  # noqa: E402,F401

MAIN = os.path.join(os.path.dirname(exoframe.__file__), "__main__.py")


def become_the_command(request: dict):
    """In the forked child: never returns."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = extra + [p for p in sys.path if p not in extra]
    import importlib
    importlib.invalidate_caches()
    sys.argv = [MAIN, *request["args"]]
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    os.close(devnull)
    try:
        exoframe.cli.entry()
    except SystemExit as e:  # entry() exits itself, or raises this for a normal exit
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        sys.stdout.flush()
        sys.stderr.flush()
        # (a normal exit: the interpreter waits for the command's threads)
        raise SystemExit(code) from None


def say(message: dict):
    os.write(1, (json.dumps(message) + "\n").encode())


def serve():
    running = {}  # pid -> request id
    buffered = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.02 if running else 1.0)
        if readable:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                break  # the tests are done
            buffered += chunk
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    try:
                        become_the_command(request)
                    except SystemExit:
                        raise
                    except BaseException:
                        traceback.print_exc()
                    os._exit(1)
                try:
                    os.setpgid(pid, pid)
                except OSError:
                    pass  # (it did so itself first)
                running[pid] = request["id"]
                say({"id": request["id"], "pid": pid})
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid in running:
                say({"id": running.pop(pid), "returncode": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    serve()
