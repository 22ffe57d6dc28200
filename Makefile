# strata: the commands a user needs. Each target installs missing Debian
# packages first (deploy/install-deps.sh, needs root or sudo).
#   make demo    local cluster (1 coordinator, 2 servers) trains an MLP with 2 workers
#   make test    build and run the whole test suite
#   make build   configure and build everything into build/
#   make check   clang-format check + the test suite under ASan/UBSan (build-asan/, clang-14)
#   make bench   strata-bench step on 64 Mi parameters (see README)
#   make deploy-test  docker-compose on a real Docker engine (deploy/deploy-test.sh; root)
#   make fuzz    libFuzzer harnesses (tests/fuzz; build-asan/) for FUZZ_SECONDS each
#   make slurm-test  deploy/slurm/strata.sbatch on a one-machine Slurm cluster (root)

CTEST_ARGS ?=
# Extra cmake arguments when a build tree is first configured (CI:
# -DSTRATA_DEBUG_LEVEL=1).
CMAKE_ARGS ?=
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 60
FUZZERS = safetensors_fuzz checkpoint_manifest_fuzz saved_chunk_fuzz nvme_extent_fuzz services_fuzz \
  push_message_fuzz

.PHONY: deps build test demo asan-configure check format-check bench deploy-test slurm-test hosts-test fuzz clean

deps:
	@bash deploy/install-deps.sh

build: deps
	@test -f build/build.ninja || cmake --preset default $(CMAKE_ARGS)
	cmake --build --preset default -j $(JOBS)

test: build
	ctest --preset default -j $(JOBS) $(CTEST_ARGS)

demo: build
	bash deploy/local-cluster.sh

format-check: deps
	git ls-files '*.h' '*.cc' '*.cu' | xargs clang-format --dry-run --Werror

# The sanitizer tree (clang-14) also holds the fuzz harnesses: one build for
# `make check` and `make fuzz`. A tree configured with another compiler is
# configured afresh.
asan-configure: deps
	@grep -qs '^CMAKE_CXX_COMPILER:.*clang++-14$$' build-asan/CMakeCache.txt || \
	  { rm -rf build-asan && cmake --preset asan $(CMAKE_ARGS); }

check: format-check asan-configure
	cmake --build --preset asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp ctest --preset asan -j $(JOBS) $(CTEST_ARGS)

slurm-test: build
	@bash deploy/install-deps.sh --slurm
	bash deploy/slurm/slurm-test.sh

hosts-test: build
	@bash deploy/install-deps.sh --hosts
	bash deploy/hosts-test.sh

fuzz: asan-configure
	cmake --build --preset asan -j $(JOBS) --target $(FUZZERS)
	bash tests/fuzz/run.sh $(FUZZ_SECONDS) $(FUZZERS)

bench: build
	build/bin/strata-bench step --params 67108864 --workers 2 --servers 2 --json

deploy-test: build
	@bash deploy/install-deps.sh --deploy
	bash deploy/deploy-test.sh

clean:
	rm -rf build build-asan
