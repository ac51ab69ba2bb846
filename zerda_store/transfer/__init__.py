"""Moving sessions between databases: the JSON Lines export format, its checks, and imports.

What the command line's ``export``, ``import`` and ``copy`` use beside
:class:`~zerda_store.AdminRepository`: writing a session's file, reading and checking one,
and the words for what a receipt carried."""

from ..retention.carrying import described
from ..validation import checked_session_id
from .checks import file_key_rules
from .format import ExportFile, write_session, write_session_file

__all__ = [
    "ExportFile",
    "checked_session_id",
    "described",
    "file_key_rules",
    "write_session",
    "write_session_file",
]
