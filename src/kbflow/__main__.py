"""``python -m kbflow``: the same command line as ``kbflow``."""

from kbflow.cli import main

main()
