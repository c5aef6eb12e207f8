"""Asking a store: the client of `codeveil serve` and what it advises on an error, and
the query side of a search the server ranks (a server-search workspace)."""
