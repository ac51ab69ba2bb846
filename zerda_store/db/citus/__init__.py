"""Citus: distributing the tables by session, and growing and shrinking the cluster."""
