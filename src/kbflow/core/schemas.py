"""Arrow schemas of every snapshot table. Bump SCHEMA_VERSION when a schema changes."""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = "5"  # 2: documents.encoding; 3: manifest.graph, the graph stage's edges; 4: manifest.markdown_sha256;
# 5: manifest.location

DOCUMENTS = pa.schema(
    [
        ("doc_id", pa.string()),
        ("source_path", pa.string()),  # relative, stable: '<root folder name>/<path inside it>' or 'text:<id>'
        ("abs_path", pa.string()),
        ("source_sha256", pa.string()),
        ("size", pa.int64()),
        ("mtime", pa.float64()),
        ("mime", pa.string()),
        ("converter", pa.string()),
        ("markdown", pa.large_string()),
        ("status", pa.string()),  # ok | failed
        ("error", pa.string()),
        ("encoding", pa.string()),  # text decoded from this encoding (utf-8, gb18030, ...); null for binary formats
    ]
)

SECTIONS = pa.schema(
    [
        ("doc_id", pa.string()),
        ("ordinal", pa.int32()),
        ("heading_path", pa.list_(pa.string())),
        ("text", pa.large_string()),
        ("char_start", pa.int64()),
        ("char_end", pa.int64()),
        ("kind", pa.string()),  # paragraph | code | table | list | heading
    ]
)

CHUNKS = pa.schema(
    [
        ("chunk_id", pa.string()),
        ("doc_id", pa.string()),
        ("ordinal", pa.int32()),
        ("text", pa.large_string()),
        ("heading_path", pa.list_(pa.string())),
        ("char_start", pa.int64()),
        ("char_end", pa.int64()),
        ("n_tokens", pa.int32()),  # tokens of the embedded text, special tokens included
        ("text_sha256", pa.string()),  # of the stored text
        ("embed_prefix", pa.string()),  # heading context the model reads before the text (not stored in the text)
        ("embed_sha256", pa.string()),  # of embed_prefix + text, what the model reads: the vector cache key
        ("chunker", pa.string()),
        ("text_tokens", pa.large_string()),  # BM25 words of text (kbflow.search.tokens), stored with the row
    ]
)


def vectors_schema(dim: int) -> pa.Schema:
    return pa.schema(
        [
            ("embed_sha256", pa.string()),
            ("model_id", pa.string()),
            ("vector", pa.list_(pa.float32(), dim)),
        ]
    )


EDGES = pa.schema(
    [
        ("edge_id", pa.string()),  # hash of chunk_id, kind, target, anchor: one row per distinct edge of a chunk
        ("doc_id", pa.string()),
        ("chunk_id", pa.string()),  # the chunk the edge leaves from
        ("source_path", pa.string()),
        ("kind", pa.string()),  # link | defines | heading (kbflow.graph.extract) | entity | relation (llm_extract)
        ("target", pa.string()),  # link: the linked document's source path; defines, heading, entity: the term's
        # key; relation: its target entity's key
        ("anchor", pa.string()),  # link: the fragment after '#' ('' for none); relation: its source entity's key
        ("label", pa.string()),  # link: its text | title; defines, heading: the term as written; entity: "name
        # (type)"; relation: "source —relation→ target"
        ("extractor", pa.string()),  # name@version of what extracted it
    ]
)

FAILURES = pa.schema(
    [
        ("stage", pa.string()),
        ("doc_id", pa.string()),
        ("source_path", pa.string()),
        ("chunk_ids", pa.list_(pa.string())),
        ("error_type", pa.string()),
        ("message", pa.string()),
        ("attempts", pa.int32()),
    ]
)

MANIFEST = pa.schema(
    [
        ("doc_id", pa.string()),
        ("source_path", pa.string()),
        ("origin", pa.string()),  # file | text: only 'file' documents are removed when they vanish from the sources
        ("source_sha256", pa.string()),
        ("converter", pa.string()),
        ("chunker", pa.string()),
        ("model_id", pa.string()),
        ("chunk_ids", pa.list_(pa.string())),
        ("run_id", pa.string()),
        ("graph", pa.string()),  # the graph extractor's fingerprint, '' or null when the graph stage is off
        # of the converted Markdown the stored chunks were made from: a changed file whose new Markdown has the same
        # hash (and fingerprints) is not chunked or written again. Null in rows written before it was recorded
        ("markdown_sha256", pa.string()),
        # where a file document really is (its real path, an object's URL; kbflow.sources.local): the same file
        # named another way is found again. Null for texts, uploads, web pages and rows written before it was kept
        ("location", pa.string()),
    ]
)

PLAN = pa.schema(
    [
        ("doc_id", pa.string()),
        ("source_path", pa.string()),
        ("action", pa.string()),  # new | changed | unchanged | removed
        ("source_sha256", pa.string()),
    ]
)


def store_schema(dim: int) -> pa.Schema:
    """Rows of a namespace's chunk table in the store."""
    return pa.schema(
        [
            ("chunk_id", pa.string()),
            ("doc_id", pa.string()),
            ("source_path", pa.string()),
            ("ordinal", pa.int32()),
            ("heading_path", pa.list_(pa.string())),
            ("text", pa.large_string()),
            ("text_tokens", pa.large_string()),  # BM25 words of text, space-joined (kbflow.search.tokens)
            ("char_start", pa.int64()),
            ("char_end", pa.int64()),
            ("n_tokens", pa.int32()),
            ("embed_sha256", pa.string()),
            ("vector", pa.list_(pa.float32(), dim)),
        ]
    )
