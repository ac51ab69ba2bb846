"""The schema's life: Alembic revisions and the lock they run under, the contract step, what a database holds before it is used, what `db check` found, and the roles `db grant` sets up."""
