"""`codeveil serve`: the store over HTTP (sync.store behind it), its refs and invitee
endpoints, its middleware and whether it may listen beyond loopback."""
