# diagsink: the two commands of the README, and the steps they are made of.
#   make book   set up .venv, build the website into _build/html (every notebook executed)
#   make test   set up .venv, run the whole test suite (what CI runs)
# Variables: PYTHON (interpreter for the venv), DIAGSINK_QUICK (1 = quick mode, the default
# here; 0 = full mode), PIP_EXTRA (extra pip options, e.g. a PyTorch index URL), SEQUENTIAL
# (1 = `make test` runs its two lanes one after the other instead of side by side).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN     = $(VENV)/bin
PIP_EXTRA ?=
SEQUENTIAL ?= 0
export DIAGSINK_QUICK ?= 1
export PYTHONHASHSEED = 0
JB_FLAGS = -W -n --keep-going

.PHONY: setup book test unit notebooks build-book browser clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	# torch and the package in one pip command: the pin picks the CPU build from the local
	# wheel where there is one and keeps a bare `torch` from pulling a multi-GB CUDA build.
	$(BIN)/python -m pip install --quiet -c constraints.txt $(PIP_EXTRA) "torch==2.13.0" -e ".[book,test]"
	touch $@

book: setup build-book
	@echo
	@echo "The book is built. Open: file://$(CURDIR)/_build/html/index.html"

build-book:
	$(BIN)/jupyter-book build . $(JB_FLAGS)

unit: setup
	$(BIN)/python -m pytest tests -m "not browser"

notebooks: setup
	$(BIN)/python -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider book

browser: setup
	$(BIN)/python -m pytest tests -m browser; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]

test: setup
	BIN=$(BIN) SEQUENTIAL=$(SEQUENTIAL) tools/run-tests

clean:
	rm -rf _build .pytest_cache .hypothesis
