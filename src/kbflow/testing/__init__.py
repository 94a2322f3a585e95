"""Local stand-ins for the services kbflow talks to (remote model APIs, a web site), real HTTP servers on
127.0.0.1 for the tests and for the benchmarks that need a service. Shipped, so an installed kbflow can run its
benchmarks, but nothing on the product path (the kbflow command's own commands, the API, the engine, the stores,
search, the MCP server) imports it."""
