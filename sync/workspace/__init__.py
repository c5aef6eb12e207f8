"""A repo's workspace as this machine holds it: opening it on its store, its status, its
refs, inviting a teammate and joining one's workspace."""
