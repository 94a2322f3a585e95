"""``python -m kbflow``: the same command line as ``kbflow``."""

from kbflow.cli.main import main

main()
