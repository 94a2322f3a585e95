"""The knowledge graph of a namespace: what the documents say about each other, beside the vectors (how graph
search scores, measured, is in docs/retrieval.md).

* ``extract``: the graph stage, a pure function over a chunk batch: the links between pages and sections (resolved
  to the linked document's source path and anchor), the terms a chunk defines (definition lists, glossaries,
  configuration parameters) and the heading each section starts with; ``llm_extract`` adds the entities and
  relations a chat model reads from a chunk, and ``terms`` is the key both match queries on.
* ``store``: the edges in one LanceDB table per namespace (``graph_<namespace>``) beside the vector cache, replaced
  document by document like the chunks, so a removed document's edges go with it.
* ``expand``: graph-aware search: seeds from the query (its best hits, and the chunks defining a term it names),
  links followed within a hop budget, each reached chunk scored by its similarity to the query and returned with
  the path that reached it.
"""
