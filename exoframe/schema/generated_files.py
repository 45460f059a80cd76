"""Files the documentation keeps that are made from the code (docs/reference's pages,
docs/schemas' JSON Schemas): written whole, checked for drift, and their generators' one
command line: `python -m <generator> [FOLDER] [--check]`. (Here, low in the package, so
that exoframe.schema's generator and the CLI's reference both stand on it.)"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from ..files import write_atomic

# docs/ beside the package: there in a source checkout only (not in an installed wheel)
CHECKOUT_DOCS = Path(__file__).resolve().parents[2] / "docs"


def write_files(folder: Path, made: dict) -> list[Path]:
    """Write `made` (file name: text) into `folder`; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in made.items():
        write_atomic(folder / name, text)
    return [folder / name for name in made]


def stale_files(folder: Path, made: dict, pattern: str) -> list[str]:
    """The files of `folder` matching `pattern` that differ from `made` (name: the text a
    generator makes now): changed, missing, or there and not made."""
    there = {path.name for path in folder.glob(pattern)} if folder.is_dir() else set()
    return sorted(name for name in set(made) | there
                  if name not in made or name not in there
                  or (folder / name).read_text() != made[name])


def generator_main(argv, *, prog: str, description: str, what: str, source: str,
                   made: Callable[[], dict], pattern: str,
                   default_folders: Callable[[Path], list[Path]],
                   checkout_docs: Path | None = None,
                   missing: Callable[[], str | None] = lambda: None) -> int:
    """A generator's command line: write `made()` into FOLDER (by default
    default_folders(docs/ of the source checkout)), or with --check write nothing and exit 1,
    naming them, where the files there differ. what: the files ("pages"); source: what they
    are made from ("the code"); missing(): why they cannot be made here, or None."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("folder", nargs="?", type=Path, metavar="FOLDER",
                        help=f"where the {what} go (default: in docs/ of the source checkout "
                             "this module is in)")
    parser.add_argument("--check", action="store_true",
                        help=f"write nothing; exit 1, naming them, if the {what} in FOLDER "
                             f"differ from what {source} makes now")
    args = parser.parse_args(argv)
    why = missing()
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    docs = checkout_docs or CHECKOUT_DOCS
    if args.folder is None and not docs.is_dir():
        print(f"error: no docs/ folder beside this exoframe ({docs.parent}): it is not a "
              "source checkout; give FOLDER", file=sys.stderr)
        return 2
    folders = [args.folder] if args.folder is not None else default_folders(docs)
    texts = made()
    if args.check:
        differ = [f"{folder}: {', '.join(names)}" for folder in folders
                  if (names := stale_files(folder, texts, pattern))]
        if differ:
            print(f"{'; '.join(differ)} differ from {source}: run {prog}", file=sys.stderr)
            return 1
        print(f"{', '.join(map(str, folders))}: up to date")
        return 0
    for folder in folders:
        for path in write_files(folder, texts):
            print(f"wrote {path}")
    return 0
