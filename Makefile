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
# `make demo` has an environment of its own with only what the demo needs (the CPU wheel of
# torch, cookiecutter, the project's dependencies: requirements-demo.txt), not the test
# toolchain of .venv. The CPU index is named: pip's default would take a CUDA build.
DEMO_ENV := build/demo-env
DEMO_STAMP := $(DEMO_ENV)/.installed
CPU_INDEX := https://download.pytorch.org/whl/cpu
# The demo's commands, as a user types them in the project. One CPU thread: the example's
# small model trains as fast on one, and beside other work two OpenMP threads on two shared
# cores spin waiting for each other (six times the CPU time, measured on a loaded 2-core machine).
DEMO_RUN := cd $(DEMO)/my_hpc_project && OMP_NUM_THREADS=1 PYTHONPATH=src \
	../../demo-env/bin/python -m my_hpc_project
PYTEST_ARGS ?=
# The tests without Slurm run on two pytest workers (both cores of a CI machine; one test file
# per worker at a time, so its module fixtures are made once). The real-Slurm tests then run
# alone, one at a time: a local cluster's ranks rendezvous over TCP with timeouts, and beside
# two busy workers the two-node jobs missed theirs (see docs/contributing.md).
TEST_WORKERS ?= 2
# What `make test` runs: every test that bakes, updates or checks answers and docs, none that
# runs a generated project's suite, the tutorial, a container, uv or Slurm. On two cores: 5.4
# minutes quiet; `make test-all` (CI) adds the rest: 31 minutes for the tests without Slurm
# (the default project's whole suite, one process, takes 23 of them), then 11 for the Slurm
# tests (measured on a quiet 2-core machine, 2026-12).
QUICK_TESTS := tests/test_rules.py tests/test_questions.py tests/test_bad_answers.py \
	tests/test_bake.py tests/test_engines.py tests/test_lint.py tests/test_docs.py \
	tests/test_update.py tests/test_makefile_values.py
# Which tests `make release` runs first: all (`make test-all`, about 45 minutes), quick
# (`make test`) or none; the tag's message records which. SKIP_TESTS=1 means none.
TESTS ?= all
RELEASE_TESTS := $(if $(SKIP_TESTS),none,$(TESTS))
# release.py runs the mirror generators' checks, which need .venv's packages where it exists.
RELEASE_PYTHON = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
REMOTE ?= origin
# Values you pass (TORCH=, PYTEST_ARGS=, REPOS=, TEMPLATE=, REMOTE=) reach the commands as
# environment variables (`$$PYTEST_ARGS` in a recipe), never pasted into its text: make would
# hand `$(...)` or backticks in a value to the shell to run.
export TORCH PYTEST_ARGS TEST_WORKERS REPOS JSON TEMPLATE REMOTE
# PYTEST_ARGS reach pytest as typed (PYTEST_ARGS="-k 'bake and not cruft'"): split into words
# as a shell splits them, quotes honoured, nothing expanded or run, by the generated project's
# tools/with_args.py, the splitter of its own ARGS (standard library only).
PYTEST = ARGS="$$PYTEST_ARGS" $(PYTHON) '{{cookiecutter.project_slug}}/tools/with_args.py' \
	$(BIN)/python -m pytest

.DEFAULT_GOAL := help
.PHONY: help demo test test-all sync bench bench-install release publish fleet clean

help: ## List the commands
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

$(STAMP): requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$$TORCH"
	$(BIN)/pip install --quiet -r requirements-test.txt
	touch $@

# torch alone comes from the CPU index (--no-deps): its dependencies, like the rest, come from
# the default index in the second install, which keeps the torch installed first. Only one
# package is looked up on the CPU index: where it cannot be reached (a mirror or proxy, a
# wheel in pip.conf's find-links), pip's retries cost seconds once, not once per package.
# --no-compile: pip would byte-compile every module of every package (two thirds of the
# install's CPU time); Python compiles the few the demo imports when it first imports them.
$(DEMO_STAMP): requirements-demo.txt
	$(PYTHON) -m venv $(DEMO_ENV)
	$(DEMO_ENV)/bin/pip install --quiet --no-compile --no-deps "$$TORCH" --index-url $(CPU_INDEX)
	@# torch cannot be imported before its dependencies are in: its version.py says the build.
	@$(DEMO_ENV)/bin/python -c 'import runpy, sys, sysconfig; \
	cuda = runpy.run_path(sysconfig.get_path("platlib") + "/torch/version.py")["cuda"]; \
	sys.exit(cuda and f"make demo: pip installed the CUDA {cuda} build of torch, not the CPU \
	wheel of $(CPU_INDEX) (pip.conf names another index?)")'
	$(DEMO_ENV)/bin/pip install --quiet --no-compile -r requirements-demo.txt "$$TORCH"
	touch $@

demo: $(DEMO_STAMP) ## Bake the default project into build/demo and run its example end to end
	rm -rf $(DEMO)
	@# Caches that tools leave inside the template folder (git-ignored) must not be baked.
	-git clean -fdXq -- '{{cookiecutter.project_slug}}'
	@# Bake from a copy of the template's own files: cookiecutter copies the folder it bakes
	@# from for the pre-prompt hook, and .venv and build/ here are gigabytes.
	mkdir -p $(DEMO)/template
	git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C $(DEMO)/template
	$(DEMO_ENV)/bin/cookiecutter --no-input --output-dir $(DEMO) $(DEMO)/template
	$(DEMO_RUN) prepare
	$(DEMO_RUN) train run.name=demo
	$(DEMO_RUN) evaluate --run demo
	@echo "Results: $(DEMO)/my_hpc_project/runs/demo (checkpoints, metrics.csv, summary.json)"
	@echo "Figures: $(DEMO)/my_hpc_project/reports/figures/demo"

test: $(STAMP) ## The quick set: answers, bakes, engines, lint, docs, updates (no Slurm)
	@$(PYTEST) -n "$$TEST_WORKERS" --dist loadfile -m "not slurm" $(QUICK_TESTS)

test-all: $(STAMP) ## Every test, as CI runs them: adds generated suites, tutorial, environments, Slurm
	@# Exit status 5 is "no test selected": PYTEST_ARGS may name only one of the two kinds.
	@# --no-loadscope-reorder: files in the order collected, the longest first (tests/conftest.py).
	@$(PYTEST) -n "$$TEST_WORKERS" --dist loadfile --no-loadscope-reorder -m "not slurm" \
		|| [ $$? -eq 5 ]
	@$(PYTEST) -m slurm || [ $$? -eq 5 ]

sync: $(STAMP) ## Regenerate copier.yml, the presets in cookiecutter.json and the options page
	$(BIN)/python tools/sync_questions.py
	$(BIN)/python tools/gen_hook_data.py
	$(BIN)/python tools/gen_options_doc.py

release: ## Tag the version in cookiecutter.json: checks, tests (TESTS=all|quick|none), tag
	$(RELEASE_PYTHON) tools/release.py check
ifeq ($(RELEASE_TESTS),all)
	$(MAKE) test-all
else ifeq ($(RELEASE_TESTS),quick)
	$(MAKE) test
else ifneq ($(RELEASE_TESTS),none)
	$(error TESTS=$(RELEASE_TESTS): use all, quick or none)
endif
	$(RELEASE_PYTHON) tools/release.py tag --tested $(RELEASE_TESTS)

publish: ## Push the release tag to REMOTE (origin); check it has every release's tag
	$(RELEASE_PYTHON) tools/release.py publish --remote "$$REMOTE"

# The same report as a generated project's `make template-status`, run from the template's
# copy of it (standard library and git only: no .venv needed).
# TEMPLATE= reads every project against that template (one made with plain cookiecutter
# records none).
fleet: ## Which projects are behind: REPOS=file (a path or git URL a line), JSON=1, WIDE=1, TEMPLATE=url
	@test -n "$$REPOS" || { echo "make fleet: REPOS=<file with one repository path or URL a line>" >&2; exit 1; }
	@$(PYTHON) '{{cookiecutter.project_slug}}/tools/template_status.py' \
		--repos-file "$$REPOS"$(if $(JSON), --json)$(if $(WIDE), --wide)$(if $(TEMPLATE), --template "$$TEMPLATE")

bench: $(STAMP) ## Time a default bake with each engine
	$(BIN)/python tools/bench_bake.py

bench-install: $(STAMP) ## Time a generated project's failed make install-cpu to its one-line message
	$(BIN)/python tools/bench_install.py

clean: ## Remove the venv and build outputs
	rm -rf $(VENV) build
