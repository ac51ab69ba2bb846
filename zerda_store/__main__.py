"""``python -m zerda_store`` runs the ``zerda-store`` command line."""

from zerda_store.cli import main

main()
