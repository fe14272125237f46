"""Examples built on tileship. Not installed by ``pip install .``: import them from the repository
root (``python -m`` there, or the root on ``PYTHONPATH``); ``tileship serve --llama`` finds them
in the source checkout it runs from (``tileship.extras``).

    llama   a random-weight Llama-style decoder, swapped onto a release and served (``--llama``)
"""
