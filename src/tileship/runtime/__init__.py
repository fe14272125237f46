"""Stage 4, runtime: load a release into a process without compiling, and dispatch each call to
the compiled kernel or the PyTorch reference with the reason.

    loader    integrity -> lock vs environment -> every specialization loaded from the bundle alone
    dispatch  ``Release`` / ``OpRunner``: kernel or reference per call, with a ``Decision``
    nojit     the guard that makes any TileLang compile attempt raise ``CompileForbidden``
"""
