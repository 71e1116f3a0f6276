# Thin wrapper over CMake/CTest. Every target bootstraps first, so on a
# fresh Debian machine `make test` alone installs, builds and tests.
#   make          build into build/ (build/igrad, build/libigrad.so)
#   make lib      only what the Python package carries: build/libigrad.so and
#                 its plugins (libigrad_mpi.so, libigrad_cuda.so where MPI /
#                 CUDA are found); no CLI, trainer or tests
#   make test     build + run every test (unit, MPI, fuzz, CLI, Python)
#   make asan     same tests (Python ones too, ASan runtime preloaded) under
#                 AddressSanitizer + UBSan + float-cast-overflow (build-asan/)
#   make fuzz     libFuzzer (clang, ASan + UBSan) on every tests/fuzz_*.c
#                 target for FUZZ_SECONDS each (build-fuzz/; tests/fuzz/run)
#   make bench    selection benchmarks (C, and against torch.topk)
#   make demo     the main job (see README)
#   make experiments  RQ1-RQ5 in quick mode (docs/reproduce.md)
BUILD  ?= build
JOBS   ?= 2
CMAKE_FLAGS ?=
FUZZ_SECONDS ?= 60
FUZZ_BUILD ?= build-fuzz
FUZZ_TARGETS ?=

.PHONY: all bootstrap configure build lib test asan fuzz bench demo experiments clean

all: build

bootstrap:
	@scripts/bootstrap --with-python

configure: bootstrap
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS) >$(BUILD).configure.log 2>&1 \
	  || { cat $(BUILD).configure.log; exit 1; }
	@grep -E -- "-- (cJSON|cmocka|OpenBLAS|OpenMP|MPI|CUDA|NCCL|libigrad.so plugins):" \
	  $(BUILD).configure.log | sed 's/^-- /  /'

build: configure
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

lib: configure
	@cmake --build $(BUILD) --target lib -j $(JOBS) -- --no-print-directory

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

asan: bootstrap
	@$(MAKE) --no-print-directory build BUILD=build-asan CMAKE_FLAGS="-DIGRAD_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug"
	cd build-asan && ctest --output-on-failure -j $(JOBS)

# FUZZ_TARGETS="engine_state data" runs only those; FUZZ_SECONDS=N per target.
fuzz:
	@scripts/bootstrap --with-fuzz
	@CC=clang cmake -S . -B $(FUZZ_BUILD) -DIGRAD_LIBFUZZER=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  $(CMAKE_FLAGS) >$(FUZZ_BUILD).configure.log 2>&1 || { cat $(FUZZ_BUILD).configure.log; exit 1; }
	@cmake --build $(FUZZ_BUILD) --target fuzz_targets -j $(JOBS) -- --no-print-directory
	@tests/fuzz/run $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

bench: build
	$(BUILD)/igrad bench select
	/usr/bin/python3 bench/select_vs_torch.py --igrad $(BUILD)/igrad

demo: build
	@scripts/bootstrap --with-python --with-corpora
	@scripts/demo

experiments: build
	@scripts/bootstrap --with-corpora --with-netem
	@experiments/run_all

clean:
	rm -rf build build-asan build-fuzz build.configure.log build-asan.configure.log \
	  build-fuzz.configure.log
