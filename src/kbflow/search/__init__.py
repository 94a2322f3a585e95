"""The read side: full-text tokens, fusion, rerank, query expansion and the searcher that opens a namespace once."""
