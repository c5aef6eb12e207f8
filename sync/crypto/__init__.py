"""Everything that holds a workspace's key: the keys, the keyed names and ciphers, the
sealed rows, the client's Merkle tree and the pages its rows are sealed in."""
