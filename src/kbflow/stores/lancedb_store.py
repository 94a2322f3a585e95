"""LanceDB, embedded under the data dir: one table per namespace, cosine distance on normalised vectors.

Indexes follow the table's size (``refresh_indexes``, called after every write): a full-text index over
``text_tokens`` from the first row (BM25), an ANN vector index once the table holds ``vector_index_min_rows``
rows (below that an exact scan is fast enough, see docs/bench/search.json). Rows not yet in an index are still
searched (exactly), but what that costs differs by index:

* an unindexed vector is one more dot product (10k of them: a few ms) and scores exactly as it would indexed, so
  the vector index is updated when the rows written since its last build exceed ``INDEX_STALE_FRACTION`` of the
  table;
* an unindexed row is tokenized and scored on every full-text query, and scored apart from the index's BM25
  statistics, so it ranks differently than it would indexed (a dev set with 311 of its 411 rows outside the
  index: BM25 nDCG@10 0.743 against 0.770 with every row in). The full-text index is updated once
  ``FTS_STALE_ROWS`` rows wait outside it; an explicit ``refresh_indexes`` (the end of every ingest) also
  indexes the text again when any row waits outside and the table holds at most ``FTS_REBUILD_MAX_ROWS`` rows,
  where the waiting rows can be a large share. Beyond that size they are at most 2 % of the table.

Both updates are one ``optimize``, cheap beside the embedding of a document batch. What a stale index costs,
measured: docs/retrieval.md (Search: modes, filters, hybrid, rerank, ask).

The vector index is IVF (default IVF_FLAT) with ``ann_partitions(rows)`` = √rows partitions, so a query that
probes ``ann_nprobes`` of them reads ~nprobes·√rows vectors: its cost grows with the root of the table, and recall
stays put as the table grows (recall per table size: docs/retrieval.md, Search benchmark). Rows written later are
folded into the partitions the index was trained with, which then grow; once the table holds
``ANN_RETRAIN_GROWTH`` times the rows of its last training the index is trained again. The partition count is
in the index's name (``vector_ivf<partitions>``); an index of another type than the configured one, or one from
an older kbflow (no count in its name), is rebuilt at the next refresh.

Building the vector index costs memory in proportion to the table (k-means and the HNSW graph over every row;
measured in docs/reliability.md). An ingest run sets ``defer_vector_index`` while it writes its batches and
builds or updates that index once, after the last batch, when the batches' own memory is already freed, so the
two peaks do not add up.
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kbflow.config import KbConfig
from kbflow.core.errors import ConfigError
from kbflow.core.schemas import store_schema
from kbflow.core import storage
from kbflow.state.files import store_unreadable
from kbflow.state.layout import set_aside
from kbflow.stores.base import Hit, SearchFilter
from kbflow.stores.errors import damage_reason, refuse_denied
from kbflow.stores.exact import ExactCopy, version_key
from kbflow.stores.kinds import StoreKind

if TYPE_CHECKING:
    from lancedb.index import IndexConfig

IN_LIST_MAX = 500  # ids per IN (...) filter, to keep filter strings bounded
HIT_COLUMNS = ["chunk_id", "doc_id", "source_path", "heading_path", "text"]
INDEX_STALE_FRACTION = 0.1  # vector index: share of rows outside it that triggers an update
FTS_STALE_ROWS = 1_000  # full-text index: rows outside it that trigger an update (~11 ms per query at most)
FTS_REBUILD_MAX_ROWS = 50_000  # up to this size an explicit refresh re-indexes the text to bring every row in
FTS_COLUMN = "text_tokens"
ANN_RETRAIN_GROWTH = 4  # rows / rows at the vector index's last training that trigger a new training (√4 = 2x partitions)
_IVF_NAME = re.compile(r"^vector_ivf(\d+)$")


def ann_partitions(rows: int) -> int:
    """IVF partitions for a table of ``rows``: √rows (LanceDB's own rule for IVF_PQ, applied to every IVF type)."""
    return max(1, round(math.sqrt(rows)))


# A matched chunk is rewritten only when a stored column differs. Its id fixes the document and the text; the rest
# (position, heading path, the text the model read, BM25 words) can change under the same id when text above it
# moves. The vector follows from embed_sha256: a table holds one model (kbflow.engine.reembed). A patch release
# that changes one line per page so writes a page's changed chunks, not all of them. `!=` (Lance SQL has no
# IS DISTINCT FROM) is safe here because these columns are never null (kbflow.engine.rows.store_rows).
COMPARED_COLUMNS = ("doc_id", "source_path", "ordinal", "heading_path", "text", "text_tokens", "char_start",
                    "char_end", "n_tokens", "embed_sha256")
CHANGED_ROW = " OR ".join(f"target.{name} != source.{name}" for name in COMPARED_COLUMNS)


def open_table_or_none(db, name: str):
    """The table, or None when it does not exist (local connections have no table_exists)."""
    try:
        return db.open_table(name)
    except ValueError:
        return None


_INVERTED = 2**64 - 1  # manifests named u64::MAX - version (LanceDB's v2 naming): the smallest number is the newest


def _version_of(manifest: Path) -> int:
    number = int(manifest.stem)
    return _INVERTED - number if number > 2**63 else number


def table_name_for(namespace: str) -> str:
    """The LanceDB table holding a store namespace's chunks."""
    return f"chunks_{namespace}"


TABLE_FOLDERS = ("", "_versions", "data", "_indices", "_transactions", "_deletions")


def misplaced_folders(db_uri: str, table_name: str) -> list[Path]:
    """Files standing where a local table's folders belong (a bad restore, someone's redirect): LanceDB cannot open
    or write the table until they are moved."""
    where = storage.location(db_uri)
    if storage.is_remote(where):
        return []
    table = Path(where) / f"{table_name}.lance"
    return [path for path in (table / sub if sub else table for sub in TABLE_FOLDERS)
            if path.exists() and not path.is_dir()]


def check_folders(db_uri: str, table_name: str) -> None:
    """Returns when the table's folders are folders (or absent); else raises ``TableMisplaced`` naming the first
    file standing where one belongs."""
    misplaced = misplaced_folders(db_uri, table_name)
    if misplaced:
        raise TableMisplaced(f"{misplaced[0]} is a file where a folder of the table belongs")


class TableMisplaced(Exception):
    """A local table's folder is a file (raised here, reported by the caller as the damage of its store or cache)."""


def opening_damage(exc: BaseException) -> str | None:
    """Why a table could not be opened, when it is damage on disk (a file where one of its folders belongs, a
    damaged file); None for any other failure. A permission error is raised as AccessDenied: it is not damage."""
    refuse_denied(exc)
    return str(exc) if isinstance(exc, TableMisplaced) else damage_reason(exc)


def set_aside_damage(db_uri: str, table_name: str) -> list[str]:
    """A local table that cannot be opened made openable again without deleting anything: files standing where
    its folders belong, then damaged newest version manifests, are moved aside. The names moved."""
    moved = [set_aside(path).name for path in misplaced_folders(db_uri, table_name)]
    moved += set_aside_unreadable_versions(db_uri, table_name)
    return moved + set_aside_unreadable_older_versions(db_uri, table_name)


def _whole_manifest(manifest: Path) -> bool:
    """Whether a version manifest ends as a whole one does: Lance files end in the magic bytes ``LANC``."""
    try:
        with open(manifest, "rb") as handle:
            handle.seek(0, 2)
            if handle.tell() < 16:
                return False
            handle.seek(-4, 2)
            return handle.read(4) == b"LANC"
    except PermissionError:  # not damage: the caller's error names the path and the fix
        raise
    except OSError:
        return False


def set_aside_unreadable_older_versions(db_uri: str, table_name: str) -> list[str]:
    """Earlier versions whose manifests are damaged (a table that opens at its newest version still cannot list
    its versions, be restored or be compacted) are moved aside (``.set-aside``, never deleted)."""
    import lancedb

    folder = Path(db_uri) / f"{table_name}.lance" / "_versions"
    if storage.is_remote(storage.location(db_uri)) or not folder.is_dir():
        return []
    try:
        table = lancedb.connect(db_uri).open_table(table_name)
    except Exception as exc:  # noqa: BLE001 - it does not open at all: not a matter of its earlier versions
        refuse_denied(exc)
        return []
    try:
        table.list_versions()
        return []
    except Exception as exc:  # noqa: BLE001 - a damaged manifest is found below, one version at a time
        refuse_denied(exc)
    moved = []
    for manifest in sorted(folder.glob("*.manifest"), key=_version_of):
        try:
            if not _whole_manifest(manifest):
                raise ValueError("cut short")  # LanceDB's reader panics on some of these (and prints its backtrace)
            table.checkout(_version_of(manifest))
        except Exception as exc:  # noqa: BLE001 - any failure to open that version is what this is for
            refuse_denied(exc)
            manifest.rename(manifest.with_name(manifest.name + ".set-aside"))
            moved.append(manifest.name)
    table.checkout_latest()
    return moved


def set_aside_unreadable_versions(db_uri: str, table_name: str) -> list[str]:
    """A local table that cannot even be opened because its newest version's manifest is damaged (cut short,
    scrambled): that manifest is renamed out of the way (``.set-aside``, never deleted), and the next newest tried,
    until the table opens; the latest-version hint goes with them. The names moved aside; [] when it opens as it
    is or is not a local table."""
    import lancedb

    folder = Path(db_uri) / f"{table_name}.lance" / "_versions"
    if storage.is_remote(storage.location(db_uri)) or not folder.is_dir():
        return []
    moved: list[str] = []
    while True:
        try:
            table = lancedb.connect(db_uri).open_table(table_name)
            table.count_rows()
            return moved
        except Exception as exc:  # noqa: BLE001 - any failure to open is what this is for; it stops when one version opens
            refuse_denied(exc)
            manifests = sorted(folder.glob("*.manifest"), key=_version_of, reverse=True)
            if len(manifests) <= 1:
                return moved  # nothing older to open: restore_readable or clear takes it from here
            newest = manifests[0]
            newest.rename(newest.with_name(newest.name + ".set-aside"))
            moved.append(newest.name)
            hint = folder / "latest_version_hint.json"
            if hint.exists():
                hint.rename(hint.with_name(hint.name + ".set-aside"))


def unreadable_reason(table, columns: list[str]) -> str | None:
    """Why ``columns`` of a LanceDB table cannot be read in full (a data file deleted or cut short), or None."""
    try:
        table.search().select(columns).limit(None).to_arrow()
    except Exception as exc:  # LanceDB reports a missing or torn file as a plain error with the path in its text
        refuse_denied(exc)
        return f"table {table.name!r} cannot be read: {damage_reason(exc) or str(exc).strip()[:300]}"
    try:  # its earlier versions, which a restore and a compaction (`kbflow prune`) read
        table.list_versions()
    except Exception as exc:  # noqa: BLE001 - reported with its reason
        refuse_denied(exc)
        return (f"an earlier version of table {table.name!r} cannot be read: "
                f"{damage_reason(exc) or str(exc).strip()[:300]}")
    return None


def restore_readable(table, columns: list[str]) -> dict | None:
    """Make the newest version of a LanceDB table whose ``columns`` read in full its current version (LanceDB keeps
    a table's earlier versions until they are cleaned up): the current one itself when it reads whole (``current``:
    True), else an earlier one; None when none does."""
    latest = table.version
    if unreadable_reason(table, columns) is None:
        return {"version": latest, "rows": table.count_rows(), "current": True}
    versions = sorted((v["version"] if isinstance(v, dict) else v.version for v in table.list_versions()),
                      reverse=True)
    for version in versions:
        if version >= latest:
            continue
        try:
            table.checkout(version)
            readable = unreadable_reason(table, columns) is None
        except Exception as exc:  # that version's own files are gone too
            refuse_denied(exc)
            readable = False
        if readable:
            table.restore()  # a new newest version holding that version's rows
            return {"version": version, "rows": table.count_rows()}
    table.checkout_latest()
    return None


def sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def sql_list(values: list[str]) -> str:
    return ", ".join(sql_str(value) for value in values)


def select_in(table, column: str, values: list[str], columns: list[str], where: str | None = None) -> pa.Table:
    """The rows of a LanceDB table whose ``column`` is one of ``values`` (and that match ``where``), read with as
    many ``IN (...)`` filters of at most ``IN_LIST_MAX`` values as ``values`` needs."""
    parts = []
    for start in range(0, len(values), IN_LIST_MAX):
        condition = f"{column} IN ({sql_list(values[start:start + IN_LIST_MAX])})"
        query = table.search().where(f"{condition} AND {where}" if where else condition)
        parts.append(query.select(columns).limit(None).to_arrow())
    if not parts:
        return pa.schema([table.schema.field(name) for name in columns]).empty_table()
    return pa.concat_tables(parts)


def delete_in(table, column: str, values: list[str]) -> None:
    """Delete the rows whose ``column`` is one of ``values``, ``IN_LIST_MAX`` values per delete."""
    for start in range(0, len(values), IN_LIST_MAX):
        table.delete(f"{column} IN ({sql_list(values[start:start + IN_LIST_MAX])})")


def glob_to_like(pattern: str) -> str:
    """fnmatch's ``*`` and ``?`` as SQL LIKE's ``%`` and ``_``, with LIKE's own wildcards escaped ('[...]' classes
    are not supported and are refused by the caller)."""
    escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%").replace("?", "_")


def where_sql(where: SearchFilter | None) -> str | None:
    if not where:
        return None
    clauses = []
    if where.source_glob:
        if "[" in where.source_glob:
            raise ConfigError(f"source glob {where.source_glob!r}: '[...]' classes are not supported; use * and ?")
        clauses.append(f"source_path LIKE {sql_str(glob_to_like(where.source_glob))} ESCAPE '\\'")
    if where.heading_prefix:
        clauses.append(f"array_length(heading_path) >= {len(where.heading_prefix)}")
        clauses += [f"heading_path[{i}] = {sql_str(h)}" for i, h in enumerate(where.heading_prefix, 1)]
    if where.doc_ids:
        if len(where.doc_ids) > IN_LIST_MAX:
            raise ValueError(f"a filter takes at most {IN_LIST_MAX} document ids, got {len(where.doc_ids)}")
        clauses.append(f"doc_id IN ({sql_list(list(where.doc_ids))})")
    if where.chunk_ids:
        if len(where.chunk_ids) > IN_LIST_MAX:
            raise ValueError(f"a filter takes at most {IN_LIST_MAX} chunk ids, got {len(where.chunk_ids)}")
        clauses.append(f"chunk_id IN ({sql_list(list(where.chunk_ids))})")
    return " AND ".join(clauses)


class LanceStore:
    concurrent_reads = True  # searches from two threads at once are safe and run outside the GIL
    defer_vector_index = False  # True: writes keep the full-text index fresh, the vector index waits for a refresh

    def __init__(self, uri: str | Path, namespace: str, dimension: int, vector_index_min_rows: int = 10_000,
                 vector_index_type: str = "IVF_FLAT", ann_nprobes: int = 20, ann_ef: int = 128,
                 ann_refine_factor: int | None = None, mirror_dir: str | Path | None = None,
                 exact_in_memory_rows: int = 0):
        self.uri = str(uri)
        self.namespace = namespace
        self.dimension = dimension
        self.mirror_dir = None if mirror_dir is None else str(mirror_dir)
        self.table_name = table_name_for(namespace)
        self.vector_index_min_rows = vector_index_min_rows
        self.vector_index_type = vector_index_type
        self.ann_nprobes = ann_nprobes
        self.ann_ef = ann_ef
        self.ann_refine_factor = ann_refine_factor
        self._db = storage.lance_connect(self.uri)
        self._table = None
        self._fts_ready = False
        # vector searches of a small table with no vector index answer from a copy in memory (stores.exact)
        self.exact_in_memory_rows = exact_in_memory_rows
        self._exact: ExactCopy | None = None
        # searches of a table in a bucket read a local copy kept at the bucket's newest version (stores.mirror)
        self.mirror = None
        where = storage.location(self.uri)
        if mirror_dir is not None and storage.is_remote(where):
            from kbflow.stores.mirror import TableMirror

            self.mirror = TableMirror(self.uri, self.table_name, mirror_dir)
        # the folder of the table a search reads when it is on local disk (the mirror's copy, or the table itself)
        self._search_dir: Path | None = (self.mirror.local_table if self.mirror is not None else
                                         None if storage.is_remote(where) else where / f"{self.table_name}.lance")

    @property
    def settings(self) -> dict:
        """What the config made this store with beyond where it is: a copy in another process is made with the
        same (kbflow.engine.portable), or its writes would index with LanceDB's defaults."""
        return {"vector_index_min_rows": self.vector_index_min_rows, "vector_index_type": self.vector_index_type,
                "ann_nprobes": self.ann_nprobes, "ann_ef": self.ann_ef, "ann_refine_factor": self.ann_refine_factor,
                "mirror_dir": self.mirror_dir, "exact_in_memory_rows": self.exact_in_memory_rows}

    @property
    def table(self):
        if self._table is None:
            try:
                check_folders(self.uri, self.table_name)
                self._table = self._db.create_table(self.table_name, schema=store_schema(self.dimension),
                                                    exist_ok=True)
            except Exception as exc:  # a table that cannot be opened at all: its newest manifest is damaged
                reason = opening_damage(exc)
                if reason is None:
                    raise
                raise store_unreadable(self.namespace, f"table {self.table_name} cannot be opened: {reason}") \
                    from exc
            missing = set(store_schema(self.dimension).names) - set(self._table.schema.names)
            if missing:
                raise ValueError(
                    f"LanceDB table {self.table_name!r} in {self.uri} lacks columns {sorted(missing)} (written by an "
                    f"older kbflow); run `kbflow clear --namespace {self.namespace} --yes` and ingest again")
        return self._table

    def _opened_or_none(self):
        """The table opened, or None when it does not exist; StateDamaged when it exists and cannot be opened."""
        try:
            check_folders(self.uri, self.table_name)
            return open_table_or_none(self._db, self.table_name)
        except Exception as exc:
            reason = opening_damage(exc)
            if reason is None:
                raise
            raise store_unreadable(self.namespace, f"table {self.table_name} cannot be opened: {reason}") from exc

    def present(self) -> bool:
        return self._table is not None or self._opened_or_none() is not None

    def exists(self) -> bool:
        if self._table is None and self._opened_or_none() is not None:
            return self.table is not None
        return self._table is not None

    @contextmanager
    def _reading(self):
        """A read that meets damage on disk (a data file missing) is StateDamaged naming the fix, not a traceback."""
        try:
            yield
        except Exception as exc:
            refuse_denied(exc)
            reason = damage_reason(exc)
            if reason is None:
                raise
            raise store_unreadable(self.namespace, f"table {self.table_name}: {reason}") from exc

    def unreadable(self) -> str | None:
        """Why the table cannot be read whole (a data file deleted or cut short), or None (absent is readable)."""
        if not self.exists():
            return None
        return unreadable_reason(self.table, list(store_schema(self.dimension).names))

    def index_damage(self) -> str | None:
        """Why a search through the table's indexes fails (a full-text or vector index file deleted or cut short),
        or None: one full-text and one vector query, each reading every index it has."""
        if not self.exists() or self.table.count_rows() == 0:
            return None
        try:
            indexes = self._indexes()
            if FTS_COLUMN in indexes:
                self.table.search("kbflow", query_type="fts", fts_columns=FTS_COLUMN).limit(1).to_arrow()
            if "vector" in indexes:
                probe = np.ones(self.dimension, dtype=np.float32) / np.sqrt(self.dimension)
                self.table.search(probe, vector_column_name="vector").limit(1).to_arrow()
        except Exception as exc:  # noqa: BLE001 - LanceDB raises many types; each is reported, with its reason
            refuse_denied(exc)
            return damage_reason(exc) or f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        return None

    def rebuild_indexes(self) -> dict:
        """The full-text index made again from the rows, and the vector index trained again where there was one
        (each replaces the damaged one; the rows are not touched)."""
        done: dict[str, str] = {}
        if not self.exists() or self.table.count_rows() == 0:
            return done
        had_vector = any(config.columns == ["vector"] for config in self.table.list_indices())
        self._create_fts_index()
        done[FTS_COLUMN] = "rebuilt"
        if had_vector:
            self._train_vector_index(self.table.count_rows())
            done["vector"] = f"retrained {self.vector_index_type}"
        self._fts_ready = True
        return done

    def restore_readable(self) -> dict | None:
        """Restore the newest version of the table that reads whole ({version, rows}), or None when none does."""
        self._table = None
        set_aside_damage(self.uri, self.table_name)
        if not self.exists():
            return None
        restored = restore_readable(self.table, list(store_schema(self.dimension).names))
        self._fts_ready = False
        return restored

    def _cast(self, rows: pa.Table) -> pa.Table:
        schema = store_schema(self.dimension)
        return rows.select(schema.names).cast(schema)

    def upsert(self, rows: pa.Table) -> None:
        self.table.merge_insert("chunk_id").when_matched_update_all().when_not_matched_insert_all().execute(
            self._cast(rows))
        self._write_done()

    def replace_documents(self, doc_ids: list[str], rows: pa.Table) -> int:
        if len(doc_ids) > IN_LIST_MAX:
            raise ValueError(f"replace_documents takes at most {IN_LIST_MAX} documents per call, got {len(doc_ids)}")
        result = (
            self.table.merge_insert("chunk_id")
            .when_matched_update_all(where=CHANGED_ROW)
            .when_not_matched_insert_all()
            .when_not_matched_by_source_delete(f"doc_id IN ({sql_list(doc_ids)})")
            .execute(self._cast(rows))
        )
        self._write_done()
        return result.num_inserted_rows + result.num_updated_rows

    def delete_documents(self, doc_ids: list[str]) -> int:
        if not doc_ids or not self.exists():
            return 0
        before = self.table.count_rows()
        delete_in(self.table, "doc_id", doc_ids)
        return before - self.table.count_rows()

    # --- indexes -------------------------------------------------------------------------------------------
    def _indexes(self) -> dict[str, IndexConfig]:
        """Index config by indexed column."""
        return {config.columns[0]: config for config in self.table.list_indices()}

    @staticmethod
    def _stale_after(column: str, rows: int) -> float:
        """How many rows may wait outside this index before it is updated (see the module docstring)."""
        return FTS_STALE_ROWS if column == FTS_COLUMN else INDEX_STALE_FRACTION * rows

    def _create_fts_index(self) -> None:
        # whitespace: text_tokens already holds kbflow's BM25 terms (kbflow.search.tokens), the same as Qdrant's
        self.table.create_fts_index(FTS_COLUMN, base_tokenizer="whitespace", lower_case=False, stem=False,
                                    remove_stop_words=False, ascii_folding=False, with_position=False,
                                    max_token_length=None, replace=True)

    def _train_vector_index(self, rows: int) -> None:
        """A new vector index, then the old ones dropped (an index of another name is not replaced but added:
        until the drop, a search uses either, and a crash in between leaves both for the next training)."""
        partitions = ann_partitions(rows)
        name = f"vector_ivf{partitions}"
        self.table.create_index(metric="cosine", vector_column_name="vector", index_type=self.vector_index_type,
                                num_partitions=partitions, name=name, replace=True)
        for config in self.table.list_indices():
            if config.columns == ["vector"] and config.name != name:
                self.table.drop_index(config.name)

    def _vector_index_outgrown(self, vector_configs: list, rows: int) -> bool:
        """True when the vector index is not alone, not the configured type, or the table has grown
        ``ANN_RETRAIN_GROWTH``-fold since its training (or its training size is unknown: an older kbflow's)."""
        if len(vector_configs) > 1:
            return True
        [config] = vector_configs
        if config.index_type.replace("_", "").lower() != self.vector_index_type.replace("_", "").lower():
            return True
        trained = _IVF_NAME.match(config.name)
        return trained is None or rows >= ANN_RETRAIN_GROWTH * int(trained.group(1)) ** 2

    def _write_done(self) -> None:
        self.refresh_indexes(skip_vector=self.defer_vector_index, between_batches=True)

    def refresh_indexes(self, force_vector: bool = False, skip_vector: bool = False,
                        between_batches: bool = False) -> dict:
        """Create the full-text index, the vector index when the table is big enough, and update stale ones;
        ``skip_vector`` (an ingest's batches, see the module docstring) neither creates the vector index nor
        updates it for its own sake; an ``optimize`` the full-text index needs still folds new rows into it.
        ``between_batches``: a write's own refresh, which leaves up to ``FTS_STALE_ROWS`` rows outside the
        full-text index; otherwise every row is folded in."""
        done: dict[str, str] = {}
        if not self.exists():
            return done
        rows = self.table.count_rows()
        if rows == 0:
            return done
        configs = self.table.list_indices()
        indexes = {config.columns[0]: config for config in configs}
        if FTS_COLUMN not in indexes:
            self._create_fts_index()
            done[FTS_COLUMN] = "created"
        if skip_vector:
            indexes.pop("vector", None)
        elif "vector" not in indexes and (rows >= self.vector_index_min_rows or force_vector):
            self._train_vector_index(rows)
            done["vector"] = f"created {self.vector_index_type}"
        elif "vector" in indexes and self._vector_index_outgrown(
                [config for config in configs if config.columns == ["vector"]], rows):
            self._train_vector_index(rows)
            done["vector"] = f"retrained {self.vector_index_type}"
        unindexed = {name: self.table.index_stats(config.name).num_unindexed_rows
                     for name, config in indexes.items() if name not in done}
        stale = [name for name, waiting in unindexed.items() if waiting > self._stale_after(name, rows)]
        if stale:
            self.table.optimize()  # folds new rows into every index (and compacts small fragments)
            done.update({name: "updated" for name in stale})
        elif not between_batches and unindexed.get(FTS_COLUMN, 0) > 0 and rows <= FTS_REBUILD_MAX_ROWS:
            # the rows waiting outside rank apart from the index's statistics; in a table this small they are a
            # large share, and indexing it again costs little (no compaction: the data files stay as written)
            self._create_fts_index()
            done[FTS_COLUMN] = "rebuilt"
        return done

    # --- search --------------------------------------------------------------------------------------------
    @staticmethod
    def _hit(row: dict, score: float) -> Hit:
        return Hit(row["chunk_id"], row["doc_id"], row["source_path"], row["heading_path"] or [], score, row["text"])

    def _hits(self, query, score) -> list[Hit]:
        return [self._hit(row, score(row)) for row in query.to_arrow().to_pylist()]

    def _search_table(self):
        """The table a search reads, at its newest version: the local copy of a table in a bucket when there is
        one (brought up to the bucket's newest version first), else the table itself; None when there is none.

        A store held open for searches (``kbflow mcp``, a ``KnowledgeBase``) thereby sees every write that another
        process (a scheduled ingest, ``kbflow clear``) completed since it opened the table: LanceDB's handle
        otherwise stays at the version it opened. A table dropped since, or dropped and written again, is
        opened afresh."""
        if self.mirror is not None:
            with self._reading():
                return self.mirror.table()
        if self._table is not None:
            try:
                self._table.checkout_latest()  # one read of the table's newest manifest (~0.3 ms on local disk)
                return self._table
            except Exception:  # gone (dropped by another process), or written again: open what is there now
                self._table, self._fts_ready = None, False
        return self.table if self.exists() else None

    def _exact_copy(self, table) -> ExactCopy | None:
        """The in-memory copy of ``table`` at its current version when that version is served from memory
        (``kbflow.stores.exact``); read once per version."""
        table_dir = self._search_dir if self.exact_in_memory_rows > 0 else None
        key = version_key(table_dir, table.version) if table_dir is not None else None
        if key is None:
            return None
        copy = self._exact
        if copy is None or copy.key != key:
            with self._reading():
                indexed = any(config.columns == ["vector"] for config in table.list_indices())
                if indexed or table.count_rows() > self.exact_in_memory_rows:
                    copy = ExactCopy.not_served(key)
                else:
                    copy = ExactCopy.of(key, table.search().select(HIT_COLUMNS + ["vector"]).limit(None).to_arrow(),
                                        self.dimension)
            self._exact = copy
        return copy if copy.vectors is not None else None

    def searches(self) -> "PinnedSearches":
        """Searches of the table's newest version as of now, for the halves of one hybrid query: the version (in
        a bucket, the copy's sync: one request) is looked up once per query, and both halves read the same one."""
        return PinnedSearches(self, self._search_table())

    def search_vector(self, vector: np.ndarray, limit: int, where: SearchFilter | None = None,
                      exact: bool = False) -> list[Hit]:
        return self._vector_in(self._search_table(), vector, limit, where, exact)

    def _vector_in(self, table, vector: np.ndarray, limit: int, where: SearchFilter | None, exact: bool) -> list[Hit]:
        if table is None:
            return []
        sql = where_sql(where)
        copy = None if sql else self._exact_copy(table)
        if copy is not None:  # LanceDB would scan every row too: the same hits, without its per-query overhead
            rows, scores = copy.search(vector, limit)
            return [self._hit(row, score) for row, score in zip(rows, scores)]
        query = table.search(np.asarray(vector, dtype=np.float32), vector_column_name="vector")
        query = query.distance_type("cosine").limit(limit).select(HIT_COLUMNS + ["_distance"])
        if exact:
            query = query.bypass_vector_index()
        elif "IVF" in self.vector_index_type:
            # HNSW refuses ef < k ("ef must be greater than or equal to k"): a deep search widens its beam
            query = query.nprobes(self.ann_nprobes).ef(max(self.ann_ef, limit))
            if self.ann_refine_factor:
                query = query.refine_factor(self.ann_refine_factor)
        if sql:
            query = query.where(sql, prefilter=True)
        with self._reading():
            return self._hits(query, lambda r: 1.0 - r["_distance"])

    def search_text(self, query_words: list[str], limit: int, where: SearchFilter | None = None) -> list[Hit]:
        if not self._text_searchable(query_words):
            return []
        return self._text_in(self._search_table(), query_words, limit, where)

    def _text_searchable(self, query_words: list[str]) -> bool:
        if not query_words or (self.mirror is None and not self.exists()):
            return False
        if not self._fts_ready:  # a table written by an older kbflow, or by hand: index it once, here
            if self.exists() and FTS_COLUMN not in self._indexes():
                self.refresh_indexes()
            self._fts_ready = True
        return True

    def _text_in(self, table, query_words: list[str], limit: int, where: SearchFilter | None) -> list[Hit]:
        if table is None:
            return []
        query = table.search(" ".join(query_words), query_type="fts", fts_columns=FTS_COLUMN)
        query = query.limit(limit).select(HIT_COLUMNS + ["_score"])
        sql = where_sql(where)
        if sql:
            query = query.where(sql, prefilter=True)
        with self._reading():
            return self._hits(query, lambda r: r["_score"])

    # --- inspection ----------------------------------------------------------------------------------------
    def count(self) -> int:
        return self.table.count_rows() if self.exists() else 0

    def stats(self) -> dict:
        if not self.exists():
            return {"rows": 0, "documents": 0, "bytes": 0, "indexes": {}}
        with self._reading():
            docs = self.table.search().select(["doc_id"]).limit(None).to_arrow().column("doc_id")
        indexes = {}
        for column, config in self._indexes().items():
            index_stats = self.table.index_stats(config.name)
            indexes[column] = {"type": index_stats.index_type, "indexed_rows": index_stats.num_indexed_rows,
                               "unindexed_rows": index_stats.num_unindexed_rows}
        return {"rows": self.count(), "documents": len(pc.unique(docs)), "bytes": self.size_bytes(),
                "indexes": indexes}

    def chunk_ids(self) -> pa.Table:
        if not self.exists():
            return pa.table({"chunk_id": pa.array([], pa.string()), "doc_id": pa.array([], pa.string())})
        with self._reading():
            return self.table.search().select(["chunk_id", "doc_id"]).limit(None).to_arrow()

    def rows(self, columns: list[str] | None = None) -> pa.Table:
        """Every row (for verification and tests), sorted by chunk id."""
        if not self.exists():
            return store_schema(self.dimension).empty_table()
        with self._reading():
            table = self.table.to_arrow().sort_by("chunk_id")
        return table.select(columns) if columns else table

    def document_rows(self, doc_id: str, columns: list[str]) -> pa.Table:
        if not self.exists():
            return store_schema(self.dimension).empty_table().select(columns)
        with self._reading():
            return self.table.search().where(f"doc_id = {sql_str(doc_id)}").select(columns).limit(None).to_arrow()

    def size_bytes(self) -> int:
        return storage.tree_bytes(storage.location(f"{self.uri.rstrip('/')}/{self.table_name}.lance"))

    def clear(self) -> None:
        if self.present():  # whatever its schema: an older kbflow's, another model's dimension
            self._db.drop_table(self.table_name)
        self._table, self._exact = None, None
        self._fts_ready = False


class PinnedSearches:
    """A ``LanceStore``'s searches of one table version (``LanceStore.searches``)."""

    concurrent_reads = True

    def __init__(self, store: LanceStore, table):
        self.store, self.table = store, table

    def search_vector(self, vector: np.ndarray, limit: int, where: SearchFilter | None = None,
                      exact: bool = False) -> list[Hit]:
        return self.store._vector_in(self.table, vector, limit, where, exact)

    def search_text(self, query_words: list[str], limit: int, where: SearchFilter | None = None) -> list[Hit]:
        if not self.store._text_searchable(query_words):
            return []
        return self.store._text_in(self.table, query_words, limit, where)


def _open(config: KbConfig, namespace: str, dimension: int, for_search: bool) -> LanceStore:
    from kbflow.stores.factory import mirror_dir, store_uri

    search = config.search
    return LanceStore(store_uri(config), namespace, dimension, search.vector_index_min_rows, search.vector_index_type,
                      search.ann_nprobes, search.ann_ef, search.ann_refine_factor,
                      mirror_dir=mirror_dir(config) if for_search and config.store.mirror else None,
                      exact_in_memory_rows=search.exact_in_memory_rows if for_search else 0)


def _set_aside(config: KbConfig, namespace: str) -> str:
    from kbflow.stores.factory import store_uri

    moved = set_aside_damage(store_uri(config), table_name_for(namespace))
    return f"moved aside (renamed, not deleted): {', '.join(moved)}" if moved else "no damaged version found to move aside"


def _arrive(uri: str, namespace: str, dimension: int, settings: dict, defer_vector_index: bool) -> LanceStore:
    """A store sent to another process, opened there with every setting the config gave it; a fresh connection,
    since other processes write between tasks."""
    store = LanceStore(uri, namespace, dimension, **settings)
    store.defer_vector_index = defer_vector_index  # an ingest's batches leave the vector index to its end
    return store


def _travel(store: LanceStore) -> tuple:
    return _arrive, (store.uri, store.namespace, store.dimension, store.settings, store.defer_vector_index)


KIND = StoreKind("lancedb", _open, set_aside=_set_aside, travels=(LanceStore, _travel))
