"""What coding agents call beside search: definitions, references, outlines, grep, and
the install of the MCP server into agent clients."""
