"""Post-import hooks (kept in the top-level ``_ump_alloc_hooks`` module, which the start-up hook
imports without importing this package), and ``set_switch``, which hands the start-up hook what
switches a library over under ``UMP_ALLOC=1``."""

from _ump_alloc_hooks import cancel, set_switch, when_imported

__all__ = ["cancel", "set_switch", "when_imported"]
