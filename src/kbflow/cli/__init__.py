"""The ``kbflow`` command (``main``) and what its subcommands and ``kbflow bench`` share (``common``)."""
