"""Pack blocks into token-bounded chunks, correct by construction.

1. Every block becomes one or more *units* of at most ``budget`` tokens: a block that fits is one unit; a longer
   one is split at line ends (code, tables, lists), then sentence ends (。！？；.!?), then clause marks (，、,;:),
   then spaces, then hard at the token limit. Each level only ever makes pieces smaller, and the hard cut always
   advances at least one character, so splitting terminates.
2. Units of one section (same heading path, no thematic break between them) are packed greedily; each new chunk holds
   at least one unit the previous chunk did not, so packing terminates. Trailing units of the previous chunk are
   repeated as overlap, never more than ``overlap_tokens``.
3. No chunk but a section's last is left under half its budget: when a chunk under half would end because the next
   unit does not fit, that unit (over half the budget, then) is split again into units of at most half the budget,
   and the section is packed again. Each such split leaves fewer units over half, so this ends; and once it has,
   a chunk ends only where the next unit (at most half) would not fit, so it holds more than half.
4. Every chunk's embedded text (heading prefix + text) is counted again exactly; one over the limit is cut where
   the tokenizer says the limit ends, and what was cut off starts the next chunk (the rest of the section is
   packed again). Nothing is truncated, no chunk exceeds the model's limit, and none is shredded into pieces of a
   few tokens, whatever a tokenizer makes of a join (a line of dot leaders, a run of short sentences).

Chunk ids hash (doc_id, text sha256, occurrence of that text in the document): an edit early in a document does
not change the ids, or the vectors, of the chunks after it.
"""

from __future__ import annotations

import hashlib
import json
import re
from bisect import bisect_left
from dataclasses import dataclass, field, replace

from kbflow.chunk.counters import count_key
from kbflow.chunk.split import SPLIT_VERSION, Block
from kbflow.chunk.tokens import TokenCounter
from kbflow.search import tokens as words

CHUNK_VERSION = "5"  # 3: section numbers left out of the heading prefix; 4: no chunk under half its budget but a
# section's last, an over-limit chunk cut at the tokenizer's limit instead of shedding one-unit chunks; 5: a table
# that does not fit is cut between rows, every piece with its caption and header
PREFIX_SHARE = 0.25  # a heading prefix may take at most this share of a chunk's budget
HARD_CUT_WINDOW = 64  # characters per token of budget looked at for a hard cut (a word piece is shorter)

SENTENCE_RE = re.compile(r"(?<=[。！？；．])|(?<=[.!?;])(?=\s)")
CLAUSE_RE = re.compile(r"(?<=[，、：,:])")
SPACE_RE = re.compile(r"(?<=\s)(?=\S)")
LINE_RE = re.compile(r"(?<=\n)")
PROSE_LEVELS = [SENTENCE_RE, CLAUSE_RE, SPACE_RE]
LONG_LEVELS = [LINE_RE, *PROSE_LEVELS]  # code, tables and lists: line ends first
LINE_KINDS = ("code", "table", "list", "rows")  # "rows": a long table's rows, below its caption and header
# a table's caption: a line of its own right above it, all bold ("**Table 9.33. Date/Time Functions**", as HTML
# and Office conversions write a caption) or starting "Table N" / "表 N"
CAPTION_RE = re.compile(r"[ \t]*(?:\*\*[^*\n]{1,200}\*\*|(?:Table|Tab\.|表)\s*[0-9A-Z][^\n]{0,200})[ \t]*")
TABLE_RULE_RE = re.compile(r"[ \t]*\|?(?:[ \t]*:?-{3,}:?[ \t]*\|)*[ \t]*:?-{3,}:?[ \t]*\|?[ \t]*")
TABLE_CONTEXT_SHARE = 0.5  # a caption and header over this share of the budget: the table is cut like any block


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    tokens: int
    kind: str = field(default="paragraph", compare=False)  # its block's: code, tables and lists split at lines


@dataclass(frozen=True)
class Chunk:
    chunk_id: str
    ordinal: int
    text: str
    embed_text: str
    heading_path: list[str]
    char_start: int
    char_end: int
    n_tokens: int  # of embed_text, special tokens included
    text_sha256: str
    embed_sha256: str


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chunker_fingerprint(counter: TokenCounter, chunk_tokens: int, overlap_tokens: int, heading_prefix: bool) -> str:
    return (  # the split's version too: blocks and heading paths are what the chunks are made of; and the BM25
        # words stored beside each chunk (a bump re-plans every document, and rewrites the rows whose words changed)
        f"kbflow-chunk-v{CHUNK_VERSION}+split-v{SPLIT_VERSION}:tokens={chunk_tokens}:overlap={overlap_tokens}"
        f":prefix={int(heading_prefix)}:tokenizer={counter.name}:words={words.TOKENIZER_VERSION}"
    )


def trimmed_span(text: str, start: int, end: int) -> tuple[int, int]:
    """``(start, end)`` narrowed past the whitespace at both ends of ``text[start:end]`` (the span a block's text
    really covers: chunk offsets and the plan cache's count keys use it)."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _pieces(text: str, start: int, end: int, pattern: re.Pattern) -> list[tuple[int, int]]:
    cuts = [start] + [start + m.start() for m in pattern.finditer(text[start:end]) if 0 < m.start() < end - start] + [end]
    spans = [trimmed_span(text, a, b) for a, b in zip(cuts, cuts[1:])]
    return [(a, b) for a, b in spans if b > a]


def split_long(text: str, start: int, end: int, budget: int, counter: TokenCounter, kind: str) -> list[Span]:
    """Units of at most ``budget`` tokens covering every non-space character of ``text[start:end]``, in order."""
    return split_long_many([(text, start, end, budget, kind)], counter)[0]


def split_long_many(items: list[tuple[str, int, int, int, str]], counter: TokenCounter) -> list[list[Span]]:
    """``split_long`` of each (text, start, end, budget, kind), level by level over all of them at once: one
    tokenizer call per level, not per block and level. A counter with a ``splits`` memory (``MemoCounter``) keeps
    each result by the block's text, budget and kind, and gives it back without tokenizing."""
    memory: dict | None = getattr(counter, "splits", None)
    keys = [split_key(text[a:b], budget, kind) for text, a, b, budget, kind in items] if memory is not None else []
    units: list[list[Span]] = [[] for _ in items]
    pending = []  # (item, start, end, next level, made by a hard cut)
    for item, (_, a, b, _, _) in enumerate(items):
        if memory is not None and keys[item] in memory:
            units[item] = [Span(a + start, a + end, n_tokens) for start, end, n_tokens in memory[keys[item]]]
        else:
            pending.append((item, a, b, 0, False))
    fresh = {item for item, _, _, _, _ in pending}
    offsets = _block_offsets(items, sorted(fresh), counter)
    while pending:
        # a hard cut's pieces are always tokenized: the cut itself is the tokenizer's, so they cannot disagree
        known: list[int | None] = [None if hard else _count_from_offsets(items[item], offsets.get(item), a, b)
                                   for item, a, b, _, hard in pending]
        counted = iter(counter.count([items[item][0][a:b] for (item, a, b, _, _), n in zip(pending, known) if n is None]))
        counts: list[int] = [next(counted) if n is None else n for n in known]
        next_pending: list[tuple[int, int, int, int, bool]] = []
        for (item, a, b, level, _), n_tokens in zip(pending, counts):
            text, _, _, budget, kind = items[item]
            levels = LONG_LEVELS if kind in LINE_KINDS else PROSE_LEVELS
            if n_tokens <= budget:
                units[item].append(Span(a, b, n_tokens))
            elif level < len(levels):
                next_pending.extend((item, pa, pb, level + 1, False) for pa, pb in _pieces(text, a, b, levels[level]))
            else:
                while a < b:  # hard cut at the token limit, tokenizing a bounded window, not the whole rest
                    window_end = min(b, a + budget * HARD_CUT_WINDOW)
                    cut = a + counter.cut(text[a:window_end], budget)
                    piece_start, piece_end = trimmed_span(text, a, cut)
                    if piece_end > piece_start:
                        next_pending.append((item, piece_start, piece_end, level, True))
                    a = cut
        pending = next_pending
    units = [sorted(spans, key=lambda span: span.start) for spans in units]
    if memory is not None:
        for item in fresh:
            memory[keys[item]] = [[span.start - items[item][1], span.end - items[item][1], span.tokens]
                                  for span in units[item]]
    return units


SEPARATORS = frozenset(" \t\n\r")
CUT_MARKS = frozenset("。！？；．.!?;，、：,:")  # what SENTENCE_RE and CLAUSE_RE cut after: punctuation, to BERT


def _block_offsets(items, fresh: list[int], counter) -> dict[int, tuple[list[int], list[int]]]:
    """Token (starts, ends) of each fresh long block, relative to it, in one call: only for a counter whose counts
    add up across whitespace and punctuation (BERT's WordPiece) and that can give offsets; {} otherwise."""
    if not fresh or not getattr(counter, "additive_at_whitespace", False) or not hasattr(counter, "token_offsets"):
        return {}
    spans = counter.token_offsets([items[item][0][items[item][1]:items[item][2]] for item in fresh])
    return {item: ([start for start, _ in each], [end for _, end in each]) for item, each in zip(fresh, spans)}


def _count_from_offsets(item, offsets, a: int, b: int) -> int | None:
    """Tokens of the piece ``text[a:b]`` of a long block, read from the block's own tokens, where that is exact:
    both edges are the block's or lie at a word boundary the pre-tokenizer cuts at (plain whitespace beside it,
    or after a sentence or clause mark, which BERT splits off), and no token crosses them. None: count it."""
    if offsets is None:
        return None
    text, lo, hi = item[0], item[1], item[2]
    if not (a == lo or text[a - 1] in SEPARATORS or text[a - 1] in CUT_MARKS):
        return None
    if not (b == hi or text[b] in SEPARATORS or text[b - 1] in CUT_MARKS):
        return None
    starts, ends = offsets
    first, last = bisect_left(starts, a - lo), bisect_left(starts, b - lo)
    if (first > 0 and ends[first - 1] > a - lo) or (last > 0 and ends[last - 1] > b - lo):
        return None
    return last - first


def split_key(text: str, budget: int, kind: str) -> str:
    """A long block's split in a ``MemoCounter``'s ``splits``: its text's count key, then the budget and kind."""
    return f"{count_key(text)}:{budget}:{kind}"


# a heading's section number: "E.1.2. ", "12.3. ", "1. ", "A. " (one letter or number, then numbers, each with
# its dot, then a space); "2.0 API" or "3.11 What's new" (no dot after the last part) are not numbers of sections
SECTION_NUMBER = re.compile(r"^(?:[A-Z]|\d+)\.(?:\d+\.)*\s+(?=\S)")


def prefix_line(heading_path: list[str] | tuple[str, ...]) -> str:
    """'A > B > C\\n\\n', the context the model reads before a chunk, or '' for no headings. Section numbers are
    left out: when a release inserts a section, every later one is renumbered ("E.3." becomes "E.5."), and its
    chunks' text has not changed; the number stays in the stored text and its BM25 words."""
    return " > ".join(SECTION_NUMBER.sub("", heading) for heading in heading_path) + "\n\n" if heading_path else ""


def heading_prefix_text(heading_path: list[str], counter: TokenCounter, max_tokens: int) -> str:
    """``prefix_line``, dropping leading ancestors until it fits ``max_tokens`` (a prefix is context, not content)."""
    path = list(heading_path)
    while path:
        prefix = prefix_line(path)
        if counter.count([prefix])[0] <= max_tokens:
            return prefix
        path = path[1:]
    return ""


def sections_of(blocks: list[Block], markdown: str | None = None,
                long_table_chars: int | None = None) -> list[list[Block]]:
    """Runs of blocks packed together: a heading or a thematic break starts a new one (a break holds no text).
    Given the Markdown and ``long_table_chars``, a table longer than that (which may not fit one chunk: a token
    is never shorter than a character) is a section of its own, with the caption right above it."""
    groups: list[list[Block]] = []
    boundary = True
    for block in blocks:
        if block.kind == "break":
            boundary = True
            continue
        if block.kind == "navigation":  # links with no text of their own: not content, not a boundary
            continue
        if (markdown is not None and long_table_chars is not None and block.kind == "table"
                and block.char_end - block.char_start > long_table_chars and _has_header(markdown, block)):
            caption = groups[-1][-1] if groups and not boundary else None
            if caption is not None and _is_caption(markdown, caption, block):
                groups[-1].pop()
                if not groups[-1]:
                    groups.pop()
                groups.append([caption, block])
            else:
                groups.append([block])
            boundary = True  # what follows the table starts a section of its own
            continue
        if groups and not boundary and block.kind != "heading" and groups[-1][0].heading_path == block.heading_path:
            groups[-1].append(block)
        else:
            groups.append([block])
        boundary = False
    return groups


def _has_header(markdown: str, table: Block) -> bool:
    """Whether ``table`` has a header row: its second line is the rule line below a header."""
    lines = markdown[table.char_start:table.char_end].split("\n", 2)
    return len(lines) == 3 and TABLE_RULE_RE.fullmatch(lines[1]) is not None


def _is_caption(markdown: str, block: Block, table: Block) -> bool:
    """Whether ``block`` is the caption of ``table``: a one-line paragraph right above it, in caption form."""
    text = markdown[block.char_start:block.char_end].strip()
    return (block.kind == "paragraph" and block.heading_path == table.heading_path and "\n" not in text
            and not markdown[block.char_end:table.char_start].strip() and CAPTION_RE.fullmatch(text) is not None)


@dataclass(frozen=True)
class TableParts:
    """A section holding one table (and its caption): where its caption and header end and its rows start."""

    caption: str  # the caption's text, without its bold marks ("" for none)
    rows_start: int  # of the first row below the header's rule line; the text before it is each piece's context


def table_parts(markdown: str, section: list[Block]) -> TableParts | None:
    """The parts of a section that is one table (a caption may stand above it) with a header, a rule line and at
    least one row; None for any other section."""
    table = section[-1]
    if table.kind != "table" or len(section) > 2 or (len(section) == 2 and section[0].kind != "paragraph"):
        return None
    lines = markdown[table.char_start:table.char_end].split("\n", 2)
    if not _has_header(markdown, table) or not lines[2].strip():
        return None
    caption = markdown[section[0].char_start:section[0].char_end].strip() if len(section) == 2 else ""
    if caption.startswith("**") and caption.endswith("**"):
        caption = caption[2:-2].strip()
    return TableParts(" ".join(caption.split()), table.char_start + len(lines[0]) + len(lines[1]) + 2)


def _pack(units: list[Span], budget: int, overlap_tokens: int,
          kept: list[tuple[int, int]] | None = None) -> list[tuple[int, int]]:
    """Index ranges [first, last) of units per chunk, overlap included; after the ranges ``kept``, when given."""
    ranges: list[tuple[int, int]] = list(kept or [])
    position = ranges[-1][1] if ranges else 0
    while position < len(units):
        first = position
        if ranges:  # repeat trailing units of the previous chunk, within the overlap budget
            prev_first, _ = ranges[-1]
            carried = 0
            # a unit a counter puts at 0 tokens (a lone mark) still costs one: a chunk never starts with a free run
            while first - 1 > prev_first and carried + max(1, units[first - 1].tokens) <= overlap_tokens:
                first -= 1
                carried += max(1, units[first].tokens)
            while first < position and carried + units[position].tokens > budget:
                carried -= units[first].tokens
                first += 1
        total = sum(unit.tokens for unit in units[first:position])
        last = position
        while last < len(units) and (last == position or total + units[last].tokens <= budget):
            total += units[last].tokens
            last += 1
        ranges.append((first, last))
        position = last
    return ranges


def section_key(markdown: str, section: list[Block], chunker: str) -> str:
    """What a section's chunks depend on, and nothing else: its text, its blocks' kinds and offsets within it, its
    heading path, and the chunker (tokenizer, budget, overlap, prefix; every version). Chunks never cross a section,
    so an unchanged section of a changed document keeps its plan."""
    origin = section[0].char_start
    shape = [[block.kind, block.char_start - origin, block.char_end - origin] for block in section]
    body = markdown[origin:section[-1].char_end]
    return hashlib.sha256(json.dumps([chunker, section[0].heading_path, shape, body],
                                     ensure_ascii=False).encode("utf-8")).hexdigest()


@dataclass
class ChunkJob:
    """One document to chunk: its Markdown, its blocks, and (optionally) its section plans from last time, which
    ``chunk_documents`` reads and leaves updated."""

    doc_id: str
    markdown: str
    blocks: list[Block]
    plans: dict[str, dict] | None = None


def chunk_document(
    doc_id: str,
    markdown: str,
    blocks: list[Block],
    counter: TokenCounter,
    chunk_tokens: int,
    overlap_tokens: int,
    heading_prefix: bool,
    plans: dict[str, dict] | None = None,
    chunker: str = "",
) -> list[Chunk]:
    """Chunks of one document (``chunk_documents`` of one job)."""
    return chunk_documents([ChunkJob(doc_id, markdown, blocks, plans)], counter, chunk_tokens, overlap_tokens,
                           heading_prefix, chunker)[0]


def chunk_documents(jobs: list[ChunkJob], counter: TokenCounter, chunk_tokens: int, overlap_tokens: int,
                    heading_prefix: bool, chunker: str = "") -> list[list[Chunk]]:
    """Chunks of several documents. Token counts are batched over all of them (a tokenizer call costs ~1 ms
    however little it counts, and a long batch runs on every core), and per section only where a section needs
    more work.

    A job's ``plans`` (section key -> plan) makes re-chunking cost what changed: a section whose key is there
    reuses its plan (its chunks' offsets within the section, their token counts, its heading prefix) without
    tokenizing anything; the plans of the document's sections are left in ``plans`` for the next time. A plan is
    a pure function of what its key hashes (``chunker`` must be the chunker fingerprint), so reuse gives the same
    chunks."""
    content_budget = chunk_tokens - counter.special_tokens
    all_sections = [sections_of(job.blocks, job.markdown, content_budget) for job in jobs]
    all_keys = [[section_key(job.markdown, section, chunker) for section in sections] if job.plans is not None else []
                for job, sections in zip(jobs, all_sections)]
    fresh = [(j, i) for j, (job, sections) in enumerate(zip(jobs, all_sections)) for i in range(len(sections))
             if job.plans is None or all_keys[j][i] not in job.plans]
    computed = iter(_plan_sections([(jobs[j].markdown, all_sections[j][i]) for j, i in fresh], counter,
                                   content_budget, overlap_tokens, heading_prefix))
    all_plans: list[list] = [[None] * len(sections) for sections in all_sections]
    for j, i in fresh:
        all_plans[j][i] = next(computed)
    results = []
    for job, sections, keys, section_plans in zip(jobs, all_sections, all_keys, all_plans):
        if job.plans is not None:
            for i, key in enumerate(keys):
                if section_plans[i] is None:
                    section_plans[i] = job.plans[key]
            job.plans.clear()
            job.plans.update(zip(keys, section_plans))
        results.append(_chunks(job, sections, section_plans, counter.special_tokens))
    return results


def _chunks(job: ChunkJob, sections: list[list[Block]], section_plans: list[dict], special_tokens: int) -> list[Chunk]:
    chunks: list[Chunk] = []
    occurrences: dict[str, int] = {}
    markdown = job.markdown
    for section, plan in zip(sections, section_plans):
        origin, prefix = section[0].char_start, plan["prefix"]
        # a long table's pieces: each starts with the table's caption and header (the text from the section's start
        # to its first row), and the heading path names the table
        context = plan.get("context", "")
        heading_path = list(section[0].heading_path) + ([plan["caption"]] if plan.get("caption") else [])
        for relative_start, relative_end, n_tokens in plan["chunks"]:
            start, end = origin + relative_start, origin + relative_end
            text = context + markdown[start:end]
            if context and not markdown[origin + len(context):start].strip():  # the first piece: they are its own
                start = origin
            embed_text = prefix + text
            text_sha = sha256_text(text)
            occurrence = occurrences.get(text_sha, 0)
            occurrences[text_sha] = occurrence + 1
            chunks.append(
                Chunk(
                    chunk_id=hashlib.sha256(f"{job.doc_id}\x00{text_sha}\x00{occurrence}".encode()).hexdigest()[:32],
                    ordinal=len(chunks),
                    text=text,
                    embed_text=embed_text,
                    heading_path=heading_path,
                    char_start=start,
                    char_end=end,
                    n_tokens=n_tokens + special_tokens,
                    text_sha256=text_sha,
                    embed_sha256=sha256_text(embed_text) if prefix else text_sha,
                )
            )
    return chunks


WHITESPACE_JOIN_RE = re.compile(r"[ \t\n\r]+")


def _joined_at_whitespace(markdown: str, units: list[Span], first: int, last: int) -> bool:
    """Whether every gap between units ``first`` .. ``last - 1`` is plain whitespace (a hard cut inside a word,
    or a navigation block between two paragraphs, is not)."""
    return all(WHITESPACE_JOIN_RE.fullmatch(markdown, units[i].end, units[i + 1].start)
               for i in range(first, last - 1))


def _plan_sections(sections: list[tuple[str, list[Block]]], counter: TokenCounter, content_budget: int,
                   overlap_tokens: int, heading_prefix: bool) -> list[dict]:
    """Each section's plan: its heading prefix and its chunks as (start, end, tokens of prefix + text) relative to
    the section's first block. All counting of all sections (of every document: each comes with its Markdown)
    is batched.

    A chunk's count is the count of its real embedded text. With a counter whose counts add up across plain
    whitespace (``additive_at_whitespace``: BERT's WordPiece, whose pre-tokenizer cuts there and whose normaliser
    maps each character on its own), a chunk whose units are all joined by whitespace is the sum of its
    prefix's and units' counts, exactly, without tokenizing it again; every other chunk is counted."""
    if not sections:
        return []
    headings = _prefixes([section for _, section in sections], counter, int(content_budget * PREFIX_SHARE)) \
        if heading_prefix else [("", 0)] * len(sections)
    all_counts = iter(counter.count([markdown[b.char_start:b.char_end] for markdown, section in sections
                                     for b in section]))
    block_counts = [[next(all_counts) for _ in section] for _, section in sections]
    tables = _long_tables(sections, headings, block_counts, counter, content_budget)
    # a long table's pieces are counted with its caption and header, which each of them carries
    prefixes = [(heading + _context(sections[i], tables[i]), tables[i].tokens) if i in tables else (heading, tokens)
                for i, (heading, tokens) in enumerate(headings)]
    section_units: list[list[Span | int]] = []  # a block that fits is its unit; a long one, its index in `long`
    long: list[tuple[str, int, int, int, str]] = []
    for i, ((markdown, section), (prefix, prefix_tokens)) in enumerate(zip(sections, prefixes)):
        budget = content_budget - prefix_tokens
        block_units: list[Span | int] = []
        if i in tables:  # its rows, cut between rows: the caption and header are in the prefix
            block_units.append(len(long))
            long.append((markdown, tables[i].rows_start, section[-1].char_end, budget, "rows"))
            section_units.append(block_units)
            continue
        for block, n_tokens in zip(section, block_counts[i]):
            start, end = trimmed_span(markdown, block.char_start, block.char_end)
            if end <= start:
                continue
            if n_tokens <= budget:
                block_units.append(Span(start, end, n_tokens, block.kind))
            else:
                block_units.append(len(long))
                long.append((markdown, start, end, budget, block.kind))
        section_units.append(block_units)
    long_units = [[replace(span, kind=kind) for span in spans]
                  for spans, (_, _, _, _, kind) in zip(split_long_many(long, counter), long)]
    flats = [[span for unit in units for span in ([unit] if isinstance(unit, Span) else long_units[unit])]
             for units in section_units]
    budgets = [content_budget - prefix_tokens for _, prefix_tokens in prefixes]
    ranges = _filled(flats, budgets, [[] for _ in sections], [markdown for markdown, _ in sections], counter,
                     overlap_tokens)

    # every planned chunk's real embedded text: summed where that is exact, the others counted at once; a section
    # with one over the limit is cut there and packed again after it, until none is over
    additive = getattr(counter, "additive_at_whitespace", False)
    counts: list[list[int]] = [[] for _ in sections]  # of each section's chunks found within the limit so far
    pending = list(range(len(sections)))
    while pending:
        to_count: list[str] = []
        guesses: dict[int, list[int | None]] = {}
        for i in pending:
            markdown, units, (prefix, prefix_tokens) = sections[i][0], flats[i], prefixes[i]
            guesses[i] = []
            for a, b in ranges[i][len(counts[i]):]:
                if additive and _joined_at_whitespace(markdown, units, a, b):
                    guesses[i].append(prefix_tokens + sum(unit.tokens for unit in units[a:b]))
                else:
                    guesses[i].append(None)
                    to_count.append(prefix + markdown[units[a].start:units[b - 1].end])
        counted = iter(counter.count(to_count))
        over: list[int] = []
        for i in pending:
            section_counts = [next(counted) if n is None else n for n in guesses[i]]
            fitting = next((k for k, n in enumerate(section_counts) if n > content_budget), len(section_counts))
            counts[i] += section_counts[:fitting]
            if fitting < len(section_counts):
                over.append(i)
        if over:
            _cut_over(over, sections, prefixes, flats, budgets, ranges, counts, counter, content_budget,
                      overlap_tokens)
        pending = over
    plans = []
    for i, ((markdown, section), (heading, _), units, section_ranges, chunk_counts) in enumerate(zip(
            sections, headings, flats, ranges, counts)):
        origin = section[0].char_start
        plan = {"prefix": heading, "chunks": [[units[first].start - origin, units[last - 1].end - origin, n_tokens]
                                              for (first, last), n_tokens in zip(section_ranges, chunk_counts)]}
        if i in tables:
            plan.update(context=_context((markdown, section), tables[i]), caption=tables[i].caption)
        plans.append(plan)
    return plans


def _context(section: tuple[str, list[Block]], parts: TableParts) -> str:
    """What each piece of a long table starts with: the text from the section's start to the first row."""
    markdown, blocks = section
    return markdown[blocks[0].char_start:parts.rows_start]


@dataclass(frozen=True)
class LongTable(TableParts):
    tokens: int = 0  # of the heading prefix, caption and header together


def _long_tables(sections: list[tuple[str, list[Block]]], headings: list[tuple[str, int]],
                 section_counts: list[list[int]], counter: TokenCounter, content_budget: int) -> dict[int, LongTable]:
    """The sections that are one table too long for a chunk with its heading prefix, by index, whose caption and
    header take at most ``TABLE_CONTEXT_SHARE`` of the budget with the heading prefix (counted in one call).

    Too long means either count over the budget: the whole chunk's text counted as one, or the heading prefix's and
    the blocks' counts summed. SentencePiece's counts of a caption and a table need not add up to the count of both
    joined, either way: judged by the sum alone, a table whose joined text is over was cut inside a row at the
    tokenizer's limit; judged by the joined count alone, one whose sum is over was cut by the packer (which plans
    by sums) between rows without its header."""
    candidates = {}
    for i, ((markdown, section), (_, heading_tokens), block_counts) in enumerate(zip(sections, headings,
                                                                                    section_counts)):
        parts = table_parts(markdown, section)
        # parts that add up to half the budget cannot join to over all of it: only the others are counted again
        if parts is not None and sum(block_counts) > (content_budget - heading_tokens) // 2:
            candidates[i] = parts
    whole = counter.count([headings[i][0] + sections[i][0][sections[i][1][0].char_start:sections[i][1][-1].char_end]
                           for i in candidates])
    found = {i: parts for (i, parts), n_tokens in zip(candidates.items(), whole)
             if max(n_tokens, headings[i][1] + sum(section_counts[i])) > content_budget}
    contexts = [headings[i][0] + _context(sections[i], parts) for i, parts in found.items()]
    return {i: LongTable(parts.caption, parts.rows_start, tokens)
            for (i, parts), tokens in zip(found.items(), counter.count(contexts))
            if tokens <= content_budget * TABLE_CONTEXT_SHARE}


def _prefixes(sections: list[list[Block]], counter: TokenCounter, max_tokens: int) -> list[tuple[str, int]]:
    """(heading prefix, its tokens) per section, all counted in one call; a long path is shortened on its own."""
    full = [prefix_line(section[0].heading_path) for section in sections]
    result = []
    for section, prefix, n_tokens in zip(sections, full, counter.count(full)):
        if n_tokens > max_tokens:
            prefix = heading_prefix_text(section[0].heading_path, counter, max_tokens)
            n_tokens = counter.count([prefix])[0] if prefix else 0
        result.append((prefix, n_tokens))
    return result


def _underfilled(units: list[Span], ranges: list[tuple[int, int]], budget: int, kept: int) -> int | None:
    """Index of the unit after the first chunk (from the ``kept``-th on; a section's last aside) that holds under
    half the budget, by its units' counts: that unit did not fit beside it, so it is over half; None if none."""
    for first, last in ranges[kept:-1]:
        if 2 * sum(unit.tokens for unit in units[first:last]) < budget and units[last].tokens > max(1, budget // 2) \
                and units[last].kind != "rows":  # a table's row is never cut to fill a chunk
            return last
    return None


def _filled(flats: list[list[Span]], budgets: list[int], kept: list[list[tuple[int, int]]], markdowns: list[str],
            counter: TokenCounter, overlap_tokens: int) -> list[list[tuple[int, int]]]:
    """Each section's units packed after its ``kept`` ranges, with every unit that would leave a chunk under half
    the budget split again into units of at most half (``flats`` is updated in place), one tokenizer round for
    all sections at a time."""
    ranges = [_pack(units, budget, overlap_tokens, done) for units, budget, done in zip(flats, budgets, kept)]
    pending = list(range(len(flats)))
    while pending:
        underfilled = [(i, _underfilled(flats[i], ranges[i], budgets[i], len(kept[i]))) for i in pending]
        found = [(i, index) for i, index in underfilled if index is not None]
        pieces = split_long_many([(markdowns[i], flats[i][index].start, flats[i][index].end, max(1, budgets[i] // 2),
                                   flats[i][index].kind) for i, index in found], counter)
        for (i, index), parts in zip(found, pieces):
            kind = flats[i][index].kind
            flats[i][index:index + 1] = [replace(part, kind=kind) for part in parts]
            ranges[i] = _pack(flats[i], budgets[i], overlap_tokens, kept[i])
        pending = [i for i, _ in found]
    return ranges


def _cut_over(over: list[int], sections, prefixes, flats, budgets, ranges, counts, counter: TokenCounter,
              content_budget: int, overlap_tokens: int) -> None:
    """Cut each section's first chunk over the limit (the one after its ``counts``) where the tokenizer's limit
    ends; what follows the cut starts the next chunk, and the rest of the section is packed again."""
    cuts: list[tuple[int, int, int]] = []  # (section, unit cut, character where)
    for i in over:
        markdown, units, (prefix, _) = sections[i][0], flats[i], prefixes[i]
        k = len(counts[i])
        first, last = ranges[i][k]
        new_from = ranges[i][k - 1][1] if k else 0  # this chunk's own units start here; those before are overlap
        embed = prefix + markdown[units[first].start:units[last - 1].end]
        where = max(units[first].start + counter.cut(embed, content_budget) - len(prefix), units[first].start + 1)
        index = next(j for j in range(first, last) if where <= units[j].end or j == last - 1)
        if where <= units[index].start:  # the limit falls in the gap before this unit: end the chunk before it
            index -= 1
            where = units[index].end
        elif units[index].kind == "rows" and index > first and where < units[index].end:
            index -= 1  # a table's row is never cut while the chunk holds another: it ends before that row
            where = units[index].end
        if index == last - 1 and where >= units[index].end:  # a cut that disagrees with the count: move on anyway
            index, where = _smaller(markdown, units, max(first, new_from), last)
            if index == last - 1 and where >= units[index].end:  # one character over the limit with its prefix
                raise AssertionError(f"chunk over the token limit that cannot be split further: {embed[:80]!r}")
        head_start, head_end = trimmed_span(markdown, units[index].start, where)
        if index < new_from or (index == new_from and head_end <= head_start):
            ranges[i][k] = (new_from, last)  # the overlap leaves its own text no room: drop the overlap
            continue
        cuts.append((i, index, where))
    spans = [(trimmed_span(sections[i][0], flats[i][index].start, where),
              trimmed_span(sections[i][0], where, flats[i][index].end)) for i, index, where in cuts]
    counted = iter(counter.count([sections[i][0][a:b] for (i, _, _), pair in zip(cuts, spans)
                                  for a, b in pair if b > a]))
    for (i, index, _), (head, tail) in zip(cuts, spans):
        kind, k = flats[i][index].kind, len(counts[i])
        parts = [Span(a, b, next(counted), kind) for a, b in (head, tail) if b > a]
        flats[i][index:index + 1] = parts
        kept = ranges[i][:k] + [(ranges[i][k][0], index + 1 if head[1] > head[0] else index)]
        ranges[i] = _filled([flats[i]], [budgets[i]], [kept], [sections[i][0]], counter, overlap_tokens)[0]


def _smaller(markdown: str, units: list[Span], own_first: int, last: int) -> tuple[int, int]:
    """Where to end a chunk over the limit when its counter's ``cut`` says it fits: before its last unit if it has
    another of its own, else at the last space before the middle of its one unit (or the middle)."""
    if last - 1 > own_first:
        return last - 2, units[last - 2].end
    unit = units[last - 1]
    middle = (unit.start + unit.end) // 2
    space = max((m.start() for m in SPACE_RE.finditer(markdown, unit.start + 1, middle + 1)), default=0)
    return last - 1, space if space > unit.start else max(middle, unit.start + 1)

