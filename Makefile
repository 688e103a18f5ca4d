# idemgate: the two commands are `make run` and `make test`.
SHELL := /bin/bash
JOBS ?= 2

.PHONY: all deps build build-asan run test test-release test-asan bench fuzz format clean help

all: build

help:
	@echo "make run    install what is missing, build, start idemgate + demo backend (examples/quickstart.yaml)"
	@echo "make test   install what is missing, build (release and ASan+UBSan), run every test"
	@echo "make bench  wrk against idemgate and nginx in one run, ratios printed"
	@echo "make fuzz   libFuzzer on every parser fuzz target (FUZZ_SECONDS each, default 60)"
	@echo "make build  release build only (build/release)"

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake --preset release >/dev/null
	@cmake --build --preset release -j $(JOBS)

build-asan: deps
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)

run: build
	@bash scripts/run-quickstart.sh

test-release: build
	@ctest --preset release

test-asan: build-asan
	@ctest --preset asan

test: test-release test-asan

bench: build
	@bash bench/run.sh

fuzz: deps
	@bash scripts/fuzz.sh

format:
	@find src tests examples bench -name '*.h' -o -name '*.cc' | xargs clang-format -i

clean:
	@rm -rf build
