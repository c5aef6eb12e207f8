"""What a checkout keeps: its link to a workspace (config), its id, its index state, the
refs it syncs to and what it last learned from the server."""
