"""Stage 3, release: the bundle on disk (hashes, signature), its verification evidence, the
registry that publishes and rolls back releases, and diagnostics bundles of failures.

    bundle        manifest, integrity check, ed25519 signing, reproducible archives
    evidence      verification evidence stored with a release and the routing rules that read it
    registry      published releases by id and an atomic "active" pointer (rollback)
    diagnostics   everything needed to understand one failure, in one directory + .tar.gz
"""
