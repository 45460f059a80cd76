"""`exoframe report` groups runs by their whole recorded configuration but the seed: runs
that differ only in a strategy parameter, the partition or the network's latency are
separate rows with the differing field as a column; a group's seeds are distinct seeds."""
import csv
import shutil

import pytest
from conftest import one_line_error as bad

from exoframe.cli import main

RUN = ["run", "--workload", "mlp", "--strategy", "diloco", "--nodes", "2", "--steps", "4",
       "--compute", "fixed:10ms", "--no-progress"]


def net_file(folder, name, latency):
    path = folder / f"{name}.yaml"
    path.write_text(f"bandwidth: 100mbit\nlatency: {latency}\n")
    return str(path)


def one_run(tmp_path, name, *flags):
    main([*RUN, "--out", str(tmp_path / name), *flags])
    (folder,) = (tmp_path / name).iterdir()
    return folder


def report(capsys, *args):
    capsys.readouterr()
    main(["report", *map(str, args)])
    return capsys.readouterr().out.splitlines()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A diloco run, and one run changing one field each: H, the partition, the network's
    latency (same bandwidth), and the seed."""
    tmp_path = tmp_path_factory.mktemp("runs")
    near, far = net_file(tmp_path, "near", "5ms"), net_file(tmp_path, "far", "80ms")
    base = ["-p", "H=2", "--net", near]
    return {"base": one_run(tmp_path, "base", *base),
            "H": one_run(tmp_path, "H", *base, "-p", "H=4"),
            "partition": one_run(tmp_path, "partition", *base, "--partition", "dirichlet:0.5"),
            "latency": one_run(tmp_path, "latency", "-p", "H=2", "--net", far),
            "seed": one_run(tmp_path, "seed", *base, "--seed", "1")}


@pytest.mark.parametrize("field,column,values", [
    ("H", "H", {"2", "4"}), ("partition", "partition", {"iid", "dirichlet:0.5"})])
def test_runs_that_differ_in_one_field_are_separate_rows_showing_it(runs, capsys, field,
                                                                    column, values):
    lines = report(capsys, runs["base"], runs[field])
    header, rows = lines[0].split(), [line.split() for line in lines[1:3]]
    assert column in header and "seeds" not in header, lines
    assert {row[header.index(column)] for row in rows} == values, lines
    assert all(line.startswith("  diloco") for line in lines[1:3]) and "±" not in "".join(lines)


def test_runs_on_networks_that_differ_only_in_latency_are_separate_rows(runs, capsys):
    lines = report(capsys, runs["base"], runs["latency"])
    assert lines[0].split()[:3] == ["strategy", "network", "latency"], lines
    assert [line.split()[1:4] for line in lines[1:3]] == [["far", "80", "ms"],
                                                          ["near", "5", "ms"]], lines

def test_seeds_of_one_configuration_are_one_row_and_a_seed_twice_is_refused(runs, capsys,
                                                                          tmp_path):
    lines = report(capsys, runs["base"], runs["seed"], runs["H"])
    header = lines[0].split()
    assert "seeds" in header and "H" in header, lines
    by_h = {line.split()[header.index("H")]: line.split() for line in lines[1:3]}
    assert by_h["2"][header.index("seeds")] == "2" and by_h["4"][header.index("seeds")] == "1"

    again = tmp_path / "again"
    shutil.copytree(runs["base"], again)
    err = bad(capsys, "report", runs["base"], again)
    assert "seed 0" in err and str(again) in err and "one seed twice" in err
    # the same folder given twice is one run: the header, its row, the val-loss note, and
    # what bounds it (a heading, its line)
    lines = report(capsys, runs["base"], runs["base"])
    assert len(lines) == 1 + 1 + 1 + 2 and lines[-1].startswith("  diloco on "), lines


def test_the_summary_files_carry_the_differing_fields(runs, capsys, tmp_path):
    main(["report", str(runs["base"]), str(runs["H"]), str(runs["partition"]), "--out",
          str(tmp_path / "out"), "--no-plots"])
    with open(tmp_path / "out" / "sweep_summary.csv") as f:
        summary = list(csv.DictReader(f))
    assert sorted((s["H"], s["partition"], s["seeds"]) for s in summary) == [
        ("2", "dirichlet:0.5", "1"), ("2", "iid", "1"), ("4", "iid", "1")]
    with open(tmp_path / "out" / "sweep.csv") as f:
        assert {(r["H"], r["partition"]) for r in csv.DictReader(f)} == {
            ("2", "dirichlet:0.5"), ("2", "iid"), ("4", "iid")}
