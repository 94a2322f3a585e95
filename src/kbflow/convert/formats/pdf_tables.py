"""Tables on a PDF page's text layer, ruled and unruled, as Markdown tables.

Ruled: the page's ruling lines that touch one another form a grid; its horizontal rules bound the rows, its
vertical rules the columns, and each piece of text goes to the cell its centre falls in (a line that crosses a
vertical rule is cut at the space the rule passes through). Unruled: consecutive lines that each hold two or
more cells (pieces of text apart by more than a word gap) and whose cells line up in columns; a line with text
only right of the first column continues the row above (a wrapped description). A table starts with a row not
all in a monospace font (code is not a table) and its rows stay all code or all not; bullets beside text are a
list, and a first column of long text is a two-column page.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from kbflow.convert.formats.pdf_layout import CELL_GAP_EM, NUMBERED_RE, Line, Rule, Segment

BUCKET = 64.0  # points: the side of the squares rules are looked up by
SNAP = 3.0  # points: rules closer than this are one boundary (separate cell borders, outer and inner borders)
ROW_GAP_EM = 4.0  # an unruled table's rows are at most this many font sizes apart
HEADING_SIZE = 1.15  # a line in a font this much larger than the table's first row is a heading after it
WRAPPED_LINES = 8  # lines in a row of an unruled table beside its line with cells in two columns or more
ALIGNED_SHARE = 0.8  # of an unruled table's rows below the first, at least this share start every cell in a column
FIRST_COLUMN_MAX_CHARS = 40  # an unruled first column longer than this (median) is running text in two columns
LIST_MARKER_RE = re.compile(r"(?:[•◦▪▫‣⁃∙·●○■□–—*+-]\s*)+|\(?(?:\d{1,3}|[a-zA-Z]|[ivxIVX]{1,5})[.)]")  # a bullet or item number


@dataclass
class Table:
    rows: list[list[str]]
    lines: set[int]  # indices of the page's lines that the table replaces
    top: float
    bottom: float
    members: list[Line] = field(default_factory=list)  # those lines themselves (their indices change when
    # furniture is dropped)


def _snap(values: list[float]) -> list[float]:
    """Boundaries: values within SNAP of their neighbour merged into their mean."""
    return [statistics.fmean(cluster) for cluster in _snap_by(values, SNAP)]


def _components(rules: list[Rule]) -> list[list[Rule]]:
    """Rules that touch (within SNAP), transitively, grouped: each group is one table's grid. Rules are found
    through a grid of BUCKET-point squares, so a page of many short rules costs no more than it holds."""
    parent = list(range(len(rules)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    buckets: dict[tuple[int, int], list[int]] = {}
    for i, rule in enumerate(rules):
        for x in range(int((rule.left - SNAP) // BUCKET), int((rule.right + SNAP) // BUCKET) + 1):
            for y in range(int((rule.bottom - SNAP) // BUCKET), int((rule.top + SNAP) // BUCKET) + 1):
                bucket = buckets.setdefault((x, y), [])
                for j in bucket:
                    other = rules[j]
                    if rule.left <= other.right + SNAP and rule.right >= other.left - SNAP \
                            and rule.bottom <= other.top + SNAP and rule.top >= other.bottom - SNAP:
                        parent[root(i)] = root(j)
                bucket.append(i)
    groups: dict[int, list[Rule]] = {}
    for i, rule in enumerate(rules):
        groups.setdefault(root(i), []).append(rule)
    return list(groups.values())


def _ends_on(rule: Rule, others: dict[int, list[Rule]], horizontal: bool) -> bool:
    """Whether an end of a rule meets a rule of the other direction, as a grid's lines do (a table without outer
    borders has rules whose outer end meets nothing; an underline meets nothing at all). ``others`` holds
    those rules by their position across them (x of a vertical rule, y of a horizontal one) in SNAP-wide bins."""
    if horizontal:
        along, ends = (rule.top + rule.bottom) / 2, (rule.left, rule.right)
    else:
        along, ends = (rule.left + rule.right) / 2, (rule.bottom, rule.top)
    for end in ends:
        near = [o for b in (int(end // SNAP) - 1, int(end // SNAP), int(end // SNAP) + 1) for o in others.get(b, [])]
        if horizontal and any(o.left - SNAP <= end <= o.right + SNAP and o.bottom - SNAP <= along <= o.top + SNAP
                              for o in near):
            return True
        if not horizontal and any(o.bottom - SNAP <= end <= o.top + SNAP and o.left - SNAP <= along <= o.right + SNAP
                                  for o in near):
            return True
    return False


def _bins(rules: list[Rule], horizontal: bool) -> dict[int, list[Rule]]:
    bins: dict[int, list[Rule]] = {}
    for rule in rules:
        position = (rule.top + rule.bottom) / 2 if horizontal else (rule.left + rule.right) / 2
        bins.setdefault(int(position // SNAP), []).append(rule)
    return bins


def _grid_lines(grid: list[Rule]) -> tuple[list[Rule], list[Rule]]:
    """The grid's rules that end on rules of the other direction (not an underline or a rule inside a cell)."""
    across = [r for r in grid if r.horizontal]
    down = [r for r in grid if not r.horizontal]
    by_x, by_y = _bins(down, False), _bins(across, True)
    return [r for r in across if _ends_on(r, by_x, True)], [r for r in down if _ends_on(r, by_y, False)]


def _clean(rows: list[list[str]]) -> list[list[str]]:
    rows = [row for row in rows if any(cell for cell in row)]
    keep = [j for j in range(max((len(r) for r in rows), default=0)) if any(j < len(r) and r[j] for r in rows)]
    return [[row[j] if j < len(row) else "" for j in keep] for row in rows]


def ruled_tables(lines: list[Line], rules: list[Rule]) -> list[Table]:
    tables = []
    for grid in _components(rules):
        across, down = _grid_lines(grid)
        if len(across) < 2 or len(down) < 2:
            continue
        edges_x = [min(r.left for r in across), max(r.right for r in across)]  # the outer edges, drawn or not
        edges_y = [min(r.bottom for r in down), max(r.top for r in down)]
        ys = sorted(_snap([(r.top + r.bottom) / 2 for r in across] + edges_y), reverse=True)
        xs = _snap([(r.left + r.right) / 2 for r in down] + edges_x)
        left, right, top, bottom = xs[0], xs[-1], ys[0], ys[-1]
        cells: dict[tuple[int, int], list[str]] = {}
        inside = set()
        crossed = lambda gap_left, gap_right: any(gap_left <= x <= gap_right for x in xs)  # noqa: E731
        for index, line in enumerate(lines):
            middle = (line.top + line.bottom) / 2
            if not (bottom < middle < top and line.right > left and line.left < right):
                continue
            inside.add(index)
            band = next(i for i in range(len(ys) - 1) if ys[i + 1] < middle)
            for piece in line.segments(crossed):
                centre = (piece.left + piece.right) / 2
                column = next((j for j in range(len(xs) - 1) if centre < xs[j + 1]), len(xs) - 2)
                cells.setdefault((band, column), []).append(piece.text)
        rows = _clean([[" ".join(cells.get((i, j), [])) for j in range(len(xs) - 1)] for i in range(len(ys) - 1)])
        if len(rows) >= (2 if len(rows[0]) > 1 else 3) if rows else False:  # one column: not a framed note
            tables.append(Table(rows, inside, top, bottom))
    return tables


@dataclass
class _Row:
    cells: list[Segment]
    lines: list[int]
    bottom: float
    top: float
    size: float
    multi: bool  # cells in two columns or more
    mono: bool = False  # every cell in a monospace font


def _visual_rows(lines: list[Line], skip: set[int]) -> list[_Row]:
    """The page's lines top to bottom, those on one baseline as one row (PDFium gives a cell that is centred in
    a tall row after the cells beside it, on a line of its own)."""
    rows: list[_Row] = []
    for index in sorted(range(len(lines)), key=lambda i: -lines[i].bottom):
        line = lines[index]
        if index in skip:
            rows.append(_Row([], [index], line.bottom, line.top, line.em, False))  # a barrier
            continue
        cells = line.cells()
        last = rows[-1] if rows else None
        if last is not None and last.cells and abs(last.bottom - line.bottom) < 0.3 * line.em:
            last.cells = sorted(last.cells + cells, key=lambda c: c.left)  # another run on the same baseline
            last.lines.append(index)
            last.multi = len(last.cells) >= 2
            last.mono = all(lines[i].mono for i in last.lines)
        else:
            rows.append(_Row(cells, [index], line.bottom, line.top, line.em, len(cells) >= 2, line.mono))
    return rows


def _owners(run: list[_Row]) -> list[int]:
    """For each row of a run, the row with cells in several columns that it belongs to. Lines between two such
    rows are parted at the widest gap between them: those above it continue the upper row (cells aligned to
    the top), those below it begin the lower one (cells centred in a tall row)."""
    owners = list(range(len(run)))
    multi = [k for k, row in enumerate(run) if row.multi]
    for above, below in zip(multi, multi[1:]):
        gaps = [run[k - 1].bottom - run[k].top for k in range(above + 1, below + 1)]
        split = max(range(len(gaps)), key=gaps.__getitem__)
        for n, k in enumerate(range(above + 1, below)):
            owners[k] = above if n < split else below
    for k in range(multi[-1] + 1, len(run)):
        owners[k] = multi[-1]
    return owners


def _build(run: list[_Row], lines: list[Line]) -> Table | None:
    multi = [row for row in run if row.multi]
    size = statistics.median(row.size for row in run)
    tolerance = 0.8 * size
    starts = [min(cluster) for cluster in _snap_by([cell.left for row in multi for cell in row.cells], tolerance)
              if len(cluster) >= 2]  # a column starts where two rows or more start a cell
    if not 2 <= len(starts) <= max(len(row.cells) for row in multi):
        return None
    aligned = sum(all(any(abs(cell.left - x) <= tolerance for x in starts) for cell in row.cells) for row in multi[1:])
    if aligned < ALIGNED_SHARE * (len(multi) - 1):  # gaps at random places: running text, not columns
        return None
    bounds = starts[1:]

    def cut(gap_left: float, gap_right: float) -> bool:  # a wide gap, or a narrow one where a column starts
        return gap_right - gap_left > CELL_GAP_EM * size or any(abs(gap_right - x) <= tolerance for x in bounds)

    table_rows: dict[int, list[list[str]]] = {}
    for row, owner in zip(run, _owners(run)):
        columns = table_rows.setdefault(owner, [[] for _ in starts])
        for cell in sorted((piece for i in row.lines for piece in lines[i].segments(cut)), key=lambda c: c.left):
            centre = (cell.left + cell.right) / 2
            columns[sum(centre >= b for b in bounds)].append(cell.text)
    rows = _clean([[" ".join(texts) for texts in table_rows[k]] for k in sorted(table_rows)])
    first = [row[0] for row in rows if row and row[0]]
    if len(rows) < 2 or len(rows[0]) < 2 or not first or statistics.median(map(len, first)) > FIRST_COLUMN_MAX_CHARS:
        return None
    if sum(bool(LIST_MARKER_RE.fullmatch(cell)) for cell in first) * 2 >= len(first):
        return None  # bullets or item numbers beside text: a list
    return Table(rows, {i for row in run for i in row.lines}, max(r.top for r in run), min(r.bottom for r in run))


def _snap_by(values: list[float], distance: float) -> list[list[float]]:
    clusters: list[list[float]] = []
    for value in sorted(values):
        if clusters and value - clusters[-1][-1] <= distance:
            clusters[-1].append(value)
        else:
            clusters.append([value])
    return clusters


def aligned_tables(lines: list[Line], skip: set[int], locate: Callable[[list[Line]], None] | None = None) -> list[Table]:
    rows = _visual_rows(lines, skip)
    sizes: Counter[float] = Counter()
    for line in lines:
        sizes[line.size] += len(line.text)
    body = sizes.most_common(1)[0][0] if sizes else 0.0
    for row in rows:  # a numbered line in a font larger than the body's is a heading ("1.1.4   The root shell")
        row.multi = row.multi and not any(lines[k].size > HEADING_SIZE * body and NUMBERED_RE.match(lines[k].text)
                                          for k in row.lines)
    tables, i = [], 0
    while i < len(rows):
        if not rows[i].multi or rows[i].mono:  # a table starts with a row not all code (its header, mostly)
            i += 1
            continue
        run, j, single = [rows[i]], i + 1, 0
        while j < len(rows):
            row, last = rows[j], run[-1]
            if not row.cells or row.bottom > last.bottom or last.bottom - row.top > ROW_GAP_EM * row.size:
                break
            if any(lines[k].heading for k in row.lines) or row.size > HEADING_SIZE * run[0].size:
                break  # a heading ends a table
            first_body = next((r for r in run[1:] if r.multi), None)
            if row.multi and first_body is not None and row.mono != first_body.mono:
                break  # code after a table of text, or text after a table of code
            single = 0 if row.multi else single + 1
            if single > WRAPPED_LINES:  # more lines than a wrapped cell holds: the table has ended
                break
            run.append(row)
            j += 1
        while len(run) > 1 and not run[-1].multi:
            run.pop()
        if sum(r.multi for r in run) >= 2 and locate is not None:
            locate([lines[k] for r in run for k in r.lines])  # the narrow gaps where a column may start
        table = _build(run, lines) if sum(r.multi for r in run) >= 2 else None
        if table is not None:
            tables.append(table)
            i += len(run)
        else:
            i += 1
    return tables


def page_tables(lines: list[Line], rules: list[Rule], locate: Callable[[list[Line]], None] | None = None) -> list[Table]:
    """The page's tables in reading order: ruled ones first, then unruled ones among the other lines. ``locate``
    finds the narrow gaps of a candidate's lines (``pdf_layout.locate_gaps`` on the open text page)."""
    ruled = ruled_tables(lines, rules)
    taken = set().union(*(t.lines for t in ruled)) if ruled else set()
    tables = sorted(ruled + aligned_tables(lines, taken, locate), key=lambda t: min(t.lines))
    for table in tables:
        table.members = [lines[i] for i in sorted(table.lines)]
    return tables


def table_markdown(rows: list[list[str]]) -> str:
    width = max(len(row) for row in rows)

    def line(row: list[str]) -> str:
        cells = [cell.replace("|", "\\|") for cell in row] + [""] * (width - len(row))
        return "| " + " | ".join(cells) + " |"

    return "\n".join([line(rows[0]), "| " + " | ".join(["---"] * width) + " |"] + [line(row) for row in rows[1:]])
