"""``kbflow mcp``: the Model Context Protocol server (``server``: tools, resource, prompt), its typed results
(``results``) and the HTTP transport with bearer tokens scoped to namespaces (``http``)."""
