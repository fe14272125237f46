#!/usr/bin/env bash
# usage: bash benchmarks/tree_digest.sh   (repo root; prints one sha256)
# The digest of the files a GPU run executes (src/, benchmarks/*.py|*.sh|*.toml), by content: the
# device host's copy of the tree can carry a stale .git, so its `git rev-parse HEAD` does not name
# what ran. Run it here on a commit and compare with the `tree_digest` a GPU script recorded.
set -euo pipefail
find src benchmarks -type f \( -name '*.py' -o -name '*.sh' -o -name '*.toml' \) -not -path '*/__pycache__/*' \
  -not -path 'benchmarks/results/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
