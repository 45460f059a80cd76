"""A table as papers print it, in LaTeX (booktabs) and Markdown: units in the headers, a
mean and its spread over seeds in one cell (38.2 ± 0.4, the mean to the digit the spread
allows), and the best value of each column in bold.

Written by hand rather than through pandas' Styler.to_latex / to_markdown: those need
pandas, Jinja2 and tabulate as dependencies of every install, for two renderings of a few
rows; tabulate alone escapes every cell, so it cannot bold a value or write ± as $\\pm$.
The LaTeX is a `tabular` to \\input into a paper whose preamble has \\usepackage{booktabs}.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# Characters LaTeX reads as commands, and the Unicode a table's text may hold.
_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
          "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
          "^": r"\textasciicircum{}", "×": r"$\times$", "±": r"$\pm$", "≤": r"$\le$",
          "≥": r"$\ge$", "µ": r"$\mu$", "–": "--", "—": "---", "·": r"$\cdot$",
          "<": r"$<$", ">": r"$>$", "|": r"$|$"}

# ... and in a comment, where no command is read
_PLAIN = {"±": "+/-", "≤": "<=", "≥": ">=", "×": "x", "–": "-", "—": "-", "µ": "u", "·": "."}


@dataclass(frozen=True)
class Column:
    """header: the quantity, then its unit in parentheses; better: "low", "high" or None
    (no best to mark); scale: what a value is multiplied by to be read in that unit."""
    header: str
    better: str | None = None
    scale: float = 1.0
    numeric: bool = True


@dataclass(frozen=True)
class Cell:
    """A number (a mean, with its spread over seeds where there are two or more), or text
    (`value` None: the text alone, "-" where there is nothing). `rank` orders cells for
    the best of a column where the shown number does not (a bound: <= 10, > 1000)."""
    value: float | None = None
    std: float | None = None
    text: str | None = None
    rank: float | None = None


def text(value) -> Cell:
    return Cell(text="-" if value is None else str(value))


def number(value, std=None, prefix: str = "", rank: float | None = None) -> Cell:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return Cell(text="-")
    return Cell(value, std if std is not None and std > 1e-9 * abs(value) else None,
                prefix or None, rank)


def figures(value: float, std: float | None, scale: float) -> tuple[str, str | None]:
    """The mean and the spread as shown: the spread to two significant digits, the mean to
    the same decimal place; alone, the mean to four significant digits."""
    value *= scale
    if std is None:
        return _significant(value, 4), None
    std *= scale
    places = min(6, max(0, 1 - math.floor(math.log10(abs(std)))))
    return f"{value:.{places}f}", f"{std:.{places}f}"


def _significant(value: float, digits: int) -> str:
    if value == 0:
        return "0"
    places = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{min(places, 6)}f}"


def best_rows(columns: list[Column], rows: list[list[Cell]]) -> list[set[int]]:
    """For each column, the rows holding its best value (every one of a tie)."""
    best = []
    for j, column in enumerate(columns):
        ranked = [(i, _rank(row[j])) for i, row in enumerate(rows) if _rank(row[j]) is not None]
        if column.better is None or len({r for _, r in ranked}) < 2:
            best.append(set())
            continue
        sign = 1 if column.better == "low" else -1
        top = min(sign * r for _, r in ranked)
        best.append({i for i, r in ranked if math.isclose(sign * r, top, rel_tol=1e-12)})
    return best


def _rank(cell: Cell) -> float | None:
    return cell.rank if cell.rank is not None else cell.value


def _shown(cell: Cell, column: Column) -> tuple[str, str | None, str]:
    """(mean, spread, prefix) as text."""
    if cell.value is None:
        return cell.text or "-", None, ""
    mean, std = figures(cell.value, cell.std, column.scale)
    return mean, std, cell.text or ""


def latex(columns: list[Column], rows: list[list[Cell]], note: str = "") -> str:
    """A booktabs tabular; `note` (what the table is) as a comment above it."""
    bold = best_rows(columns, rows)
    spec = "".join("r" if c.numeric else "l" for c in columns)
    lines = [f"% {''.join(_PLAIN.get(ch, ch) for ch in line)}" for line in note.splitlines()]
    lines += ["% needs \\usepackage{booktabs}", f"\\begin{{tabular}}{{{spec}}}", "\\toprule",
              " & ".join(escape(c.header) for c in columns) + r" \\", "\\midrule"]
    for i, row in enumerate(rows):
        cells = []
        for j, (cell, column) in enumerate(zip(row, columns)):
            mean, std, prefix = _shown(cell, column)
            body = escape(prefix + mean) + (f" $\\pm$ {std}" if std is not None else "")
            cells.append(f"\\textbf{{{body}}}" if i in bold[j] else body)
        lines.append(" & ".join(cells) + r" \\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def markdown(columns: list[Column], rows: list[list[Cell]]) -> str:
    """A pipe table (GitHub, mkdocs, pandoc): numbers right-aligned, the best in bold."""
    bold = best_rows(columns, rows)

    def row_text(cells):
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    lines = [row_text([c.header for c in columns]),
             row_text(["---:" if c.numeric else ":---" for c in columns])]
    for i, row in enumerate(rows):
        cells = []
        for j, (cell, column) in enumerate(zip(row, columns)):
            mean, std, prefix = _shown(cell, column)
            body = prefix + mean + (f" ± {std}" if std is not None else "")
            cells.append(f"**{body}**" if i in bold[j] else body)
        lines.append(row_text(cells))
    return "\n".join(lines) + "\n"


def escape(value: str) -> str:
    """Text as LaTeX typesets it literally."""
    return "".join(_LATEX.get(ch, ch) for ch in value)
