"""``python -m tileship.cli``: the ``tileship`` command without the console script installed."""

from . import main

main()
