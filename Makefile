# hpc-ml-template: contributor commands. `make help` lists them.
# Everything runs in .venv, which `make` creates on first use from python3 alone.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU wheel of torch 2.13.0 is enough for every test; the generated project's own
# range (torch>=2.4,<3) admits it, so baked projects reuse it instead of downloading.
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed
DEMO := build/demo
PYTEST_ARGS ?=
# The tests without Slurm run on two pytest workers (both cores of a CI machine; one test file
# per worker at a time, so its module fixtures are made once). The real-Slurm tests then run
# alone, one at a time: a local cluster's ranks rendezvous over TCP with timeouts, and beside
# two busy workers the two-node jobs missed theirs (see docs/contributing.md).
TEST_WORKERS ?= 2

.DEFAULT_GOAL := help
.PHONY: help demo test sync bench release clean

help: ## List the commands
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

$(STAMP): requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -r requirements-test.txt
	touch $@

demo: $(STAMP) ## Bake the default project into build/demo and run its example end to end
	rm -rf $(DEMO)
	@# Caches that tools leave inside the template folder (git-ignored) must not be baked.
	-git clean -fdXq -- '{{cookiecutter.project_slug}}'
	$(BIN)/cookiecutter --no-input --output-dir $(DEMO) .
	cd $(DEMO)/my_hpc_project && PYTHONPATH=src ../../../$(BIN)/python -m my_hpc_project prepare
	cd $(DEMO)/my_hpc_project && PYTHONPATH=src ../../../$(BIN)/python -m my_hpc_project train run.name=demo
	cd $(DEMO)/my_hpc_project && PYTHONPATH=src ../../../$(BIN)/python -m my_hpc_project evaluate --run demo
	@echo "Results: $(DEMO)/my_hpc_project/runs/demo (checkpoints, metrics.csv, summary.json)"
	@echo "Figures: $(DEMO)/my_hpc_project/reports/figures/demo"

test: $(STAMP) ## Run every test of the template (bakes, engines, Slurm, generated suites)
	@# Exit status 5 is "no test selected": PYTEST_ARGS may name only one of the two kinds.
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not slurm" $(PYTEST_ARGS) \
		|| [ $$? -eq 5 ]
	$(BIN)/python -m pytest -m slurm $(PYTEST_ARGS) || [ $$? -eq 5 ]

sync: $(STAMP) ## Regenerate copier.yml, the presets in cookiecutter.json and the options page
	$(BIN)/python tools/sync_questions.py
	$(BIN)/python tools/gen_hook_data.py
	$(BIN)/python tools/gen_options_doc.py

release: ## Tag the version in cookiecutter.json: changelog entry, tests, tag (SKIP_TESTS=1: no tests)
	$(PYTHON) tools/release.py check
ifndef SKIP_TESTS
	$(MAKE) test
endif
	$(PYTHON) tools/release.py tag

bench: $(STAMP) ## Time a default bake with each engine
	$(BIN)/python tools/bench_bake.py

clean: ## Remove the venv and build outputs
	rm -rf $(VENV) build
