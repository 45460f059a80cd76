import os
import sys

# `python -m exoframe` puts the current folder first on sys.path, where a stray file
# (sympy.py, ...) would shadow a module that torch imports later. Workload modules named
# with --workload are still found there (see engine/plan/resolve.py, load_workload).
if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from .cli import entry  # noqa: E402

entry()
