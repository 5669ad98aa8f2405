"""Allocator objects to hand to each library yourself, laid out like RMM's ``rmm.allocators``.

:func:`ump_alloc.enable` (or ``UMP_ALLOC=1``) does all of this for you, with the stream and
transfer hooks; use these objects where a program or framework sets allocators itself:

- :mod:`ump_alloc.allocators.cupy`: ``cupy.cuda.set_allocator(ump_cupy_allocator)``
- :mod:`ump_alloc.allocators.torch`: ``torch.cuda.memory.change_current_allocator(ump_torch_allocator)``
- :mod:`ump_alloc.allocators.numba`: ``numba.cuda.set_memory_manager(UmpNumbaManager)``

Each module imports its library only when an attribute is first used.
"""

__all__ = ["cupy", "numba", "torch"]
