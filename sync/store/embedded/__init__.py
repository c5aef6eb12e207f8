"""The embedded store: many workspaces in one data dir (SQLite + LanceDB); see
sync.store for the layout. Imports sync.store.core and never sync.store.postgres."""
