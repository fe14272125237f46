"""``python -m tileship.cli``: the ``tileship`` command without the console script installed."""

from tileship.cli import main

main()
