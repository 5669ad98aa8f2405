"""Post-import hooks (kept in the top-level ``_ump_alloc_hooks`` module, which the start-up hook
imports without importing this package)."""

from _ump_alloc_hooks import cancel, when_imported

__all__ = ["cancel", "when_imported"]
