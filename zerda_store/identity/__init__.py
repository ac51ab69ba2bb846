"""Entity identity: keys and cores, resolution of mentions, aliases and merges."""
