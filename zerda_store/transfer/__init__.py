"""Moving sessions between databases: the JSON Lines export format, its checks, and imports."""
