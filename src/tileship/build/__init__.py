"""Stage 2, lock and build: pin the toolchain, then compile every specialization ahead of time
(no GPU needed) into a release bundle.

    lock      the lock file: toolchain, native-lib hashes, device, shapes; drift against it
    builder   every (operator x shape x target) compiled in isolated processes, then bundled
    worker    one specialization compiled in its own process (``python -m tileship.build.worker``)
"""
