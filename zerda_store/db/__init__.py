"""The database, in rooms that each answer one question:

- :mod:`schema`: the tables;
- :mod:`connections`: how a store connects (URLs, engine settings, idle driver connections);
- :mod:`execution`: how statements run (compiled statements, units of work, pipelines, and
  what the driver's errors mean);
- :mod:`aio`: the same for async calls (the store's database threads, awaited units of work,
  reads and writes sent from the event loop, and the one adapter to the psycopg internals
  they drive);
- :mod:`store`: the shared :class:`~store.Store`, which holds the parts above;
  :mod:`sharding` (whether its tables are distributed) and :mod:`statistics` (planner
  statistics after bulk writes) read it;
- :mod:`migration`: the schema's life (Alembic revisions, the migration lock, the contract
  step, what a database holds, least-privilege roles);
- :mod:`citus`: spreading sessions over a Citus cluster, and growing and shrinking it.
"""
