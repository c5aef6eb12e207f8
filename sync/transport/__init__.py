"""The store over HTTP: the client of `codeveil serve` and what it advises on an error."""
