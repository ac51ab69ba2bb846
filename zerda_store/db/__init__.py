"""The database: schema, URLs, engines, units of work, statements compiled once, migrations."""
