"""The documentation: the reference pages are what the code makes now (every RunConfig field,
network key, command and hook in them), README stays a front page, the site's pages are all
in its navigation, links stay inside the repository, and the site builds with --strict, as
README's command builds it. What the pages show (commands, Python, YAML) runs in
tests/test_readme.py."""
import dataclasses
import importlib.util
import re
import shlex
import subprocess
import sys

import click
import pytest

from conftest import REPO
from exoframe import hookspecs
from exoframe.cli import reference
from exoframe.config import RunConfig
from exoframe.fields import declared_flag
from exoframe.sim.network import netconfig, tcp

DOCS = REPO / "docs"
REFERENCE = DOCS / "reference"
README = REPO / "README.md"
# What a user reads: README, the site's pages, the measurements and the changelog.
USER_PAGES = [README, REPO / "CHANGELOG.md", REPO / "benchmarks" / "README.md",
              *sorted(DOCS.rglob("*.md"))]


def test_the_reference_pages_are_what_the_code_makes(capsys):
    """(The commands page is made from click's objects, option names and help strings, not
    from click's rendering of --help: a click release that lays out --help differently
    changes nothing here.)"""
    code = reference.main(["--check", str(REFERENCE)])
    assert code == 0, capsys.readouterr().err


def test_the_reference_module_checks_writes_and_refuses_in_one_line(tmp_path, capsys,
                                                                   monkeypatch):
    with pytest.raises(SystemExit) as done:
        reference.main(["--help"])
    assert done.value.code == 0 and "--check" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # (--help is no folder)
    assert reference.main([str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(reference.PAGES)
    assert reference.main(["--check", str(tmp_path)]) == 0
    (tmp_path / "hooks.md").write_text("edited by hand\n")
    (tmp_path / "extra.md").write_text("not made by the module\n")
    capsys.readouterr()
    assert reference.main(["--check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "extra.md, hooks.md differ" in err and err.count("\n") == 1, err
    monkeypatch.setattr(reference, "CHECKOUT_DOCS", tmp_path / "no-docs")  # an installed wheel
    assert reference.main([]) == 2
    err = capsys.readouterr().err
    assert "give FOLDER" in err and err.count("\n") == 1, err


def table_rows(page: str) -> dict[str, str]:
    """{first cell's `code`: the row} of every table row of a reference page."""
    rows = {}
    for line in (REFERENCE / page).read_text().splitlines():
        match = re.match(r"\| `([^`]+)` \|", line)
        if match:
            rows[match.group(1)] = line
    return rows


def test_every_run_config_field_is_in_the_configuration_reference():
    rows = table_rows("configuration.md")
    fields = [f.name for f in dataclasses.fields(RunConfig)]
    assert sorted(rows) == sorted(fields), set(rows) ^ set(fields)
    for f in dataclasses.fields(RunConfig):
        for flag in declared_flag(f).split("/"):
            assert f"`{flag}`" in rows[f.name], (f.name, flag)
        cells = [c.strip() for c in rows[f.name].strip("|").split(" | ")]
        assert len(cells) == 5 and all(cells), rows[f.name]  # key, flag, type, default, help


@pytest.mark.parametrize("keys,prefix", [
    (netconfig.NetKeys, ""), (netconfig.SiteConfig, "sites.NAME."),
    (netconfig.LinkConfig, "links[i]."), (tcp.TcpModel, "protocol.")])
def test_every_network_key_is_in_the_network_reference_with_its_meaning(keys, prefix):
    rows = table_rows("network-files.md")
    for f in dataclasses.fields(keys):
        row = rows.get(prefix + f.name)
        assert row, f"{prefix}{f.name} is not in docs/reference/network-files.md"
        meaning = row.rstrip().rstrip("|").rsplit(" | ", 1)[-1].strip()
        assert meaning, (f"{prefix}{f.name} has no meaning: give its field a comment in "
                         f"{keys.__module__}")


def test_a_fields_comment_is_its_meaning_in_the_reference():
    """The comments beside a dataclass's fields, the one above a field and the one after it,
    are read from the source (so a key added with a comment appears with it)."""
    @dataclasses.dataclass
    class Keys:
        # a first line
        # and a second
        spread: int = 1  # the end
        bare: str = ""
        after: float = 0.5  # only this

    assert reference.field_comments(Keys) == {
        "spread": "a first line and a second the end", "bare": "", "after": "only this"}


def test_every_command_option_and_hook_is_in_the_reference():
    from exoframe.cli import cli

    commands = (REFERENCE / "commands.md").read_text()
    names = click.Group.list_commands(cli, click.Context(cli))
    assert names and all(f"## exoframe {name}\n" in commands for name in names)
    for name in names:  # each command's section names its every option
        section = commands.split(f"## exoframe {name}\n", 1)[1].split("\n## ", 1)[0]
        for param in cli.commands[name].params:
            for flag in getattr(param, "opts", []) if isinstance(param, click.Option) else []:
                assert f"`{flag}`" in section, f"exoframe {name} {flag}"
    hooks = (REFERENCE / "hooks.md").read_text()
    specs = [n for n, v in vars(hookspecs).items() if hasattr(v, "exoframe_spec")]
    assert specs and all(f"## `{name}`" in hooks for name in specs)


def test_readme_is_a_front_page():
    """At most 250 lines; install, first run, the three-strategy comparison and its figure in
    that order, on its first screen and a half (the first 60 lines)."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines"
    marks = ["pip install -e '.[plot]' && exoframe run",
             "exoframe sweep --strategy ddp,diloco,streaming-diloco",
             "docs/figures/compare-time-vs-bandwidth.png"]
    at = [next((i for i, line in enumerate(lines) if mark in line), None) for mark in marks]
    assert None not in at and at == sorted(at) and at[-1] < 60, dict(zip(marks, at))


def links(text: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'src="([^"]+)"', text)


@pytest.mark.parametrize("page", USER_PAGES, ids=[str(p.relative_to(REPO)) for p in USER_PAGES])
def test_links_stay_in_the_repository_and_resolve(page):
    for target in links(page.read_text()):
        assert not re.match(r"[a-z]+:", target), f"{target}: a link that leaves the repository"
        path = target.split("#")[0]
        if path:
            assert (page.parent / path).exists(), f"{target}: no such file"


@pytest.mark.parametrize("page", USER_PAGES, ids=[str(p.relative_to(REPO)) for p in USER_PAGES])
def test_pages_speak_to_users_not_of_the_projects_work(page):
    text = page.read_text()
    for pattern in (r"\bissue \d+", r"\bissues? #?\d+", r"\bstop \d+", r"still to be taken",
                    r"\bthis stop\b", r"\.\./shared/"):
        assert not re.search(pattern, text, re.I), f"{page.name}: {pattern!r}"


def test_every_docs_page_is_in_the_sites_navigation():
    config = (REPO / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    listed = set(re.findall(r":\s*([\w/.-]+\.md)\s*$", config, re.M))
    assert pages == listed, pages ^ listed


def readmes_site_command() -> list:
    """README's command that builds the site (in a bash block, after its `pip install`)."""
    for block in re.findall(r"^```bash\n(.*?)^```", README.read_text(), re.S | re.M):
        for part in re.split(r"&&|;|\n", block):
            argv = shlex.split(part, comments=True)
            if argv[:2] == ["mkdocs", "build"]:
                return argv
    raise AssertionError("README shows no `mkdocs build` command")


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="the docs extra (mkdocs) is not installed; .ci/run installs it")
def test_the_site_builds_with_strict_as_readme_builds_it(tmp_path):
    argv = readmes_site_command()
    assert "--strict" in argv, argv
    done = subprocess.run([sys.executable, "-m", *argv, "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").is_file()
    assert "fonts.googleapis" not in (tmp_path / "site" / "index.html").read_text()
