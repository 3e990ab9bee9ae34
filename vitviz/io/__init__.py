"""The room for files: atomic writes, locks, parts."""
