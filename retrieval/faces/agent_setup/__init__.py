"""`codeveil agent install | uninstall`'s machinery, beside the command that alone uses
it (retrieval.faces.cli_agent): the agent clients and their config files (`clients`),
the edits of those files and of AGENTS.md / CLAUDE.md (`install`), and JSON with
comments edited as text (`jsonc`)."""
