"""What both store backends share: the interface they keep (backend.py), the checks
of every request, the tree plan, the row layouts, the blob pool's helpers and the
invitee tokens' record. Imports neither backend."""
