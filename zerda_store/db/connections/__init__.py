"""How a store connects: database URLs, engines with the right settings, and the idle driver connections kept between units of work."""
