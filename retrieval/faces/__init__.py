"""The ways in: the `codeveil` command, the Python API (`Index`, `MultiIndex`), the MCP
server, `doctor`, and the table of operations they are built from."""
