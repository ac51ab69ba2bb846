"""Pure values: the entity-name rules and key rules, and the records the repository speaks in."""
