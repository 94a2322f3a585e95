"""The foundation: what every layer above may use and that imports nothing above it (a test holds this).

Errors with their fixes (``errors``), locations and object storage (``urls``, ``storage``), remote calls and their
retries (``http``, ``retry``), optional dependencies and the extra that brings each (``extras``), installed plugins
(``plugins``), the Arrow schemas of everything stored (``schemas``) and the trust boundary every source from
someone else passes before a byte is read (``trust``).
"""
