"""How statements run: compiled once per store, on the driver's cursor, in units of work that run again whole when that is safe; pipelines; what the driver's errors mean."""
