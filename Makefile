# The two commands of the README. Both set everything up on a fresh machine.
.PHONY: demo test setup

setup:
	bash scripts/setup.sh

# lock -> build (CUDA sm_90a with nvcc, and the CPU target) -> load with no JIT -> call vs reference
demo: setup
	.venv/bin/tileship demo --out .tileship/demo

# the KServe SDK clients' environment (.venv-kserve), the type check (mypy src, the catalog included;
# seconds) and the test suite (CPU; GPU tests are marked `gpu` and run on the GPU test host)
test: setup
	bash scripts/setup-kserve.sh
	.venv/bin/python -m mypy src
	.venv/bin/python -m pytest -q
