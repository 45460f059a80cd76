"""What `exoframe report --paper` hands a reader, on a sweep like issue 60's (ddp, diloco
with its H, streaming-diloco at 10 Mbit/s, 100 Mbit/s and 1 Gbit/s, two seeds, a target
loss): figures whose PDFs embed no Type 3 font and whose SVGs keep text as text, legends
as a reader names things, labelled ticks on every axis, one time unit, a star where a curve
stopped at the target; and every CSV table also as LaTeX (booktabs) and Markdown."""
import csv
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
from conftest import SMALL_GPT_FLAGS

from exoframe.cli import main
from exoframe.report import plots
from exoframe.report.tables import figures

TARGET = 3.3


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("paper")
    main(["sweep", "--strategy", "ddp,diloco,streaming-diloco", "-p", "diloco.H=3",
          "-p", "streaming-diloco.H=4", "-p", "streaming-diloco.fragments=2",
          "--net", "wan-100mbps", "--bandwidth", "10mbit..1gbit", "--points", "3",
          "--seeds", "0,1", "--nodes", "2", "--steps", "10", *SMALL_GPT_FLAGS,
          "--compute", "fixed:10ms", "--target-loss", str(TARGET), "--no-plots",
          "--out", str(out), "--no-progress"])
    (folder,) = out.glob("*-sweep")
    return folder


@pytest.fixture(scope="module")
def report(sweep, tmp_path_factory):
    """The report in a paper's style, and what each figure drew (its axes after drawing)."""
    figures_drawn = {}
    save = plots._save

    def spy(plt, fig, ax, path, legend_title, style):
        save(plt, fig, ax, path, legend_title, style)
        fig.canvas.draw()
        figures_drawn[path.stem] = {
            "legend": [t.get_text() for t in ax.get_legend().get_texts()],
            "xticks": [t.get_text() for t in ax.get_xticklabels() if t.get_text()],
            "yticks": [t.get_text() for t in ax.get_yticklabels() if t.get_text()],
            "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel()}

    out = tmp_path_factory.mktemp("report") / "paper"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "_save", spy)
        main(["report", str(sweep), "--paper", "--format", "pdf,svg", "--out", str(out)])
    return out, figures_drawn


def pdf_fonts(path: Path) -> list[str]:
    """The Subtype of every font dictionary of a PDF (matplotlib writes them uncompressed)."""
    data = path.read_bytes()
    fonts = re.findall(rb"/Type\s*/Font\b(.*?)>>", data, re.S)
    return [m.decode() for f in fonts for m in re.findall(rb"/Subtype\s*/(\w+)", f)]


def test_paper_figures_embed_truetype_and_say_what_a_reader_needs(report):
    out, drawn = report
    pdfs = sorted(out.glob("*.pdf"))
    assert len(pdfs) == len(drawn) >= 10
    for pdf in pdfs:
        fonts = pdf_fonts(pdf)
        assert fonts and "Type3" not in fonts, (pdf.name, fonts)
        assert set(fonts) <= {"Type0", "CIDFontType2", "TrueType"}, (pdf.name, fonts)
        assert b"/FontFile2" in pdf.read_bytes()  # the TrueType program, embedded
    for svg in out.glob("*.svg"):
        text = svg.read_text()
        assert "<text" in text and 'id="DejaVuSans' not in text, svg.name  # text, not paths
    units = set()
    for name, figure in drawn.items():
        assert not any("@" in entry for entry in figure["legend"]), (name, figure["legend"])
        assert len(figure["xticks"]) >= 2 and len(figure["yticks"]) >= 2, (name, figure)
        for label in (figure["xlabel"], figure["ylabel"]):
            if label.startswith(("simulated wall-clock", "simulated time")):
                units.add(re.search(r"\((s|min|h)\b", label)[1])
    assert units == {"s"}  # one time unit for the whole sweep
    # networks by bandwidth and latency, strategies with the parameter that differs
    assert drawn["compare_wan-100mbps_10mbit"]["legend"][:3] == [
        "ddp", "diloco (H=3)", "streaming-diloco (H=4)"]
    assert drawn["loss_vs_time_ddp"]["legend"][:3] == [
        "1 Gbit/s, 25 ms", "100 Mbit/s, 25 ms", "10 Mbit/s, 25 ms"]
    # curves that stopped at the target end with a star, and the caption says so
    stopped = [n for n, f in drawn.items() if "stopped at the target" in f["legend"]]
    assert "val_loss_wan-100mbps_1gbit" in stopped
    for name in stopped:
        assert "a star ends each curve whose run stopped at the target (val loss 3.3)" in (
            out / f"{name}.caption.txt").read_text()


def latex_rows(tex: str) -> list[list[str]]:
    body = tex.split("\\midrule\n")[1].split("\\bottomrule")[0]
    return [re.split(r"(?<!\\)&", line.removesuffix(" \\\\")) for line in body.splitlines()]


def test_each_csv_table_is_also_latex_and_markdown(report, sweep, tmp_path):
    out, _ = report
    tables = sorted(p.stem for p in out.glob("*.csv"))
    assert tables == ["speedup", "sweep", "sweep_summary", "utilization"]
    for name in tables:
        tex, md = (out / f"{name}.tex").read_text(), (out / f"{name}.md").read_text()
        spec = re.search(r"\\begin\{tabular\}\{([lr]+)\}", tex)[1]
        assert tex.count("\\toprule") == tex.count("\\midrule") == tex.count("\\bottomrule") == 1
        assert tex.rstrip().endswith("\\end{tabular}") and tex.isascii()
        rows = latex_rows(tex)
        assert rows and all(len(r) == len(spec) for r in rows), name
        assert not re.search(r"(?<!\\)[%_#]", tex.split("\\begin{tabular}")[1]), name
        lines = md.strip().splitlines()
        assert len(lines) == 2 + len(rows)
        assert all(line.count(" | ") == len(spec) - 1 for line in lines), name
        assert set(lines[1].replace("|", "").split()) <= {":---", "---:"}
    # sweep_summary: the mean ± std over seeds of each setup, the best time in bold
    with open(sweep / "sweep.csv") as f:
        runs = list(csv.DictReader(f))
    md = (out / "sweep_summary.md").read_text()
    setup = [float(r["simulated_seconds"]) for r in runs
             if r["strategy"] == "ddp" and r["net"].endswith("@10mbit")]
    mean, std = figures(statistics.mean(setup), statistics.stdev(setup), 1.0)
    (row,) = [line for line in md.splitlines() if line.startswith("| ddp | 10 Mbit/s, 25 ms |")]
    assert f"| {mean} ± {std} |" in row
    times = {line.split(" | ")[0][2:] + line.split(" | ")[1]: line.split(" | ")[4]
             for line in md.splitlines()[2:]}
    fastest = min(times, key=lambda k: float(times[k].strip("*").split(" ±")[0]))
    assert times[fastest].startswith("**") and sum(v.startswith("**")
                                                   for v in times.values()) >= 1
    assert "(s)" in md.splitlines()[0] and "(%)" in md.splitlines()[0]
    if shutil.which("pdflatex"):  # a TeX installed: the tables compile
        (tmp_path / "doc.tex").write_text(
            "\\documentclass{article}\\usepackage{booktabs}\\usepackage{graphicx}"
            "\\begin{document}" + "".join(f"\\resizebox{{\\textwidth}}{{!}}{{\\input{{{out / n}"
                                          f".tex}}}}\n\n" for n in tables) + "\\end{document}")
        done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error",
                               "doc.tex"], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-2000:]


def test_a_sweeps_result_prints_in_a_few_lines_and_its_table_is_the_reports(sweep, capsys):
    import exoframe

    main(["report", str(sweep)])
    printed = capsys.readouterr().out
    result = exoframe.SweepResult.load(sweep)
    assert printed == result.table() + "\n"  # the table, utilization and what bounds each
    assert "what bounds each setup" in printed
    text = repr(result)
    assert len(text) < 1000 and len(text.splitlines()) <= 5, text
    assert "ddp, diloco, streaming-diloco × 3 networks, 2 seeds" in text and str(sweep) in text
    folder, rows = result  # unpacks as the engine's sweep() returned before
    assert folder == sweep and len(rows) == 18
    pandas = pytest.importorskip("pandas")
    setups = result.dataframe()
    assert isinstance(setups, pandas.DataFrame) and len(setups) == 9
    assert list(setups["simulated_seconds_mean"]) == pytest.approx(
        [s["simulated_seconds_mean"] for s in result.summary()])
    assert len(result.dataframe(per="run")) == 18
