"""Stage 1, declare: what a user writes (``Operator``, ``TensorArg``, ``DynamicRange``), the
project file that lists operator modules, and the shapes and inputs derived from a declaration.

    spec      operator declarations and their specializations (``expand``)
    project   the project file (``tileship.toml`` / ``[tool.tileship]``) and operator loading
    inputs    which shapes to exercise for a specialization and random inputs for them
"""
