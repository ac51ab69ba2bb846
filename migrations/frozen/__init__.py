"""Code that past revisions run, frozen with them: never edited once a revision uses it,
and importing nothing of the library (whose modules move), so that a revision keeps doing
what it did when it was written. A revision loads it by path, as a package of its own."""
