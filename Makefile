# skv build. `make deps` installs Debian packages; `make` builds ./skv;
# `make test` runs every tests/test_*.c binary and Python test (TESTS="a b":
# only those; `make test-fast`: all but the slow ones); `make asan` does the same under
# AddressSanitizer + UndefinedBehaviorSanitizer in a separate build folder.

CC      ?= gcc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ( [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc ))
NVCC    := $(NVCC)
ifeq ($(SANITIZE),1)
BUILD   ?= build-asan
OPT     ?= -O1 -fno-omit-frame-pointer -march=native
SAN     ?= -fsanitize=address,undefined -fno-sanitize-recover=undefined
export ASAN_OPTIONS ?= detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=1
export UBSAN_OPTIONS ?= print_stacktrace=1
else
BUILD   ?= build
# The dynamic cost model lets -O2 vectorize loops whose trip count is not a
# constant (the elementwise ops; without it f32 prefill ran 13% slower).
# Floating-point sums are not reordered by it.
OPT     ?= -O2 -march=native -fvect-cost-model=dynamic
SAN     ?=
endif
PKGS     = ncursesw libpcre2-8 libcjson libpng openblas lapacke freetype2
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

# Layers, from the ground up: kernels < probes < engine < views < tui.
INC_DIRS = kernels kernels/cpu probes engine engine/model engine/tok engine/kv views tui
CFLAGS  = -std=c11 $(OPT) $(EXTRA_CFLAGS) -g -Wall -Wextra -Werror -D_GNU_SOURCE -fopenmp \
          $(addprefix -I,$(INC_DIRS)) $(PKG_CFLAGS) $(SAN) -MMD -MP
LDLIBS  = $(PKG_LIBS) -fopenmp -lpthread -lm

# oneDNN (Debian libdnnl-dev, installed by make deps) does the CPU GEMMs when
# present: its kernels are picked by the CPU's instruction sets, whatever
# OPENBLAS_CORETYPE says (docs/PERFORMANCE.md). Without it, OpenBLAS.
ifneq ($(DNNL),0)
ifneq ($(wildcard /usr/include/dnnl.h),)
CFLAGS  += -DSKV_HAVE_DNNL
LDLIBS  += -ldnnl
endif
endif

LIB_SRC  = $(wildcard kernels/*.c kernels/cpu/*.c probes/*.c engine/*.c engine/*/*.c views/*.c)
TUI_SRC  = $(wildcard tui/*.c)
# tests/gpu/ on a real device: make gpu-check; make test runs them on the simulator
TEST_SRC = $(wildcard tests/test_*.c)

# The CUDA backend (kernels/cuda/, SKV_HAVE_CUDA) is built when nvcc is found
# (`make CUDA=0` leaves it out): device code for sm_80 (A100) and sm_90
# (H100), and sm_90's PTX, which the driver compiles for a newer GPU;
# warnings as errors in nvcc and in the host compiler. It is a shared object,
# $(BUILD)/libskv-cuda.so (linked with cudart, cuBLAS and cuSOLVER), that skv
# loads at run time from beside itself (kernels/backend.c): skv links no CUDA
# library, so it starts where they are absent and says why cuda is not
# available. skv exports its symbols (-rdynamic) for the object's calls
# into it; the build's test binaries find the object by their run path.
ifneq ($(CUDA),0)
ifneq ($(NVCC),)
CU_SRC   = $(wildcard kernels/cuda/*.cu)
CU_C_SRC = $(wildcard kernels/cuda/*.c)
# nvcc may be a wrapper script elsewhere on PATH (/usr/local/bin/nvcc), so
# the toolkit's own folder comes from nvcc itself (its TOP in --dryrun), and
# its libraries from whichever of its folders holds libcudart.so.
CUDA_DIR := $(realpath $(shell $(NVCC) --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^\#\$$ TOP=//p'))
CUDA_LIB := $(firstword $(foreach d,targets/x86_64-linux/lib lib64 lib,$(if $(wildcard $(CUDA_DIR)/$(d)/libcudart.so),$(CUDA_DIR)/$(d))))
CUDA_INC := $(firstword $(foreach d,targets/x86_64-linux/include include,$(if $(wildcard $(CUDA_DIR)/$(d)/cuda_runtime.h),$(CUDA_DIR)/$(d))))
CUDA_LIBS_OK := $(and $(CUDA_LIB),$(wildcard $(CUDA_LIB)/libcublas.so),$(wildcard $(CUDA_LIB)/libcusolver.so))
ifeq ($(and $(CUDA_LIBS_OK),$(CUDA_INC)),)
$(warning nvcc ($(NVCC)) found but not the CUDA runtime's headers or its cudart, cuBLAS and cuSOLVER libraries under '$(CUDA_DIR)': building without the CUDA backend)
CU_SRC   =
CU_C_SRC =
endif
ifneq ($(CU_SRC),)
SIM_LDLIBS := $(LDLIBS)
CFLAGS  += -DSKV_HAVE_CUDA
LDLIBS  += -rdynamic -ldl
CUDA_SO  = $(BUILD)/libskv-cuda.so
CUDA_SO_LIBS = -L$(CUDA_LIB) -lcudart -lcublas -lcusolver -Wl,-rpath,$(CUDA_LIB) -lstdc++ -lm
TEST_RPATH = -Wl,-rpath,$(abspath $(BUILD))
endif
endif
endif
NVCCFLAGS = -O2 -std=c++17 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90] \
            -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror,-fPIC -DSKV_HAVE_CUDA

LIB_OBJ  = $(LIB_SRC:%.c=$(BUILD)/%.o)
CUDA_SO_OBJ = $(CU_C_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.cu.o)

# The CUDA simulator (tests/cusim/, docs/TESTING.md): the unchanged .cu files
# compiled by clang++ as C++ against the simulator's stand-in headers, every
# load and store of a kernel hooked (trace-loads/stores) for the checks, no
# nvcc or GPU needed. $(BUILD)/sim/libskv.a is the library with the CUDA
# backend on the simulator; the tests in tests/gpu/ and tests/sim/ link it.
SIM_CXX     ?= clang++
SIM_LDLIBS  ?= $(LDLIBS)
SIM_DIR      = $(BUILD)/sim
SIM_CU_OBJ   = $(patsubst kernels/cuda/%.cu,$(SIM_DIR)/cuda/%.o,$(wildcard kernels/cuda/*.cu))
SIM_RT_OBJ   = $(SIM_DIR)/cusim.o $(SIM_DIR)/cusim_libs.o
SIM_C_OBJ    = $(SIM_DIR)/backend.o $(SIM_DIR)/backend_cuda.o
SIM_BASE_OBJ = $(filter-out $(BUILD)/kernels/backend.o,$(LIB_OBJ))
SIM_CXXFLAGS = -std=c++17 -O2 -g -Wall -Wextra -Werror -D_GNU_SOURCE -Itests/cusim/include -Itests/cusim \
               $(addprefix -I,$(INC_DIRS)) $(shell pkg-config --cflags openblas lapacke 2>/dev/null)
# Kernel files: every load and store reported to the simulator (cusim.cpp's
# access), and no vectorizing, so a host access of 8 bytes is an 8-byte
# access on the device too (a double, a pointer, a size_t), held to its
# alignment, not two floats the host compiler joined.
SIM_KFLAGS   = -fsanitize-coverage=edge,trace-loads,trace-stores -fno-vectorize -fno-slp-vectorize
SIM_TEST_SRC = $(wildcard tests/gpu/test_*.c) $(wildcard tests/sim/test_*.c) $(wildcard tests/sim/test_*.cu)
SIM_TEST_BIN = $(patsubst tests/%.cu,$(SIM_DIR)/tests/%,$(SIM_TEST_SRC:tests/%.c=$(SIM_DIR)/tests/%))
TUI_OBJ  = $(TUI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN = $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

.PHONY: peers-table figures eval-demo all deps test test-fast bench asan clean check-deps
all: skv $(BUILD)/default-model.gguf

skv: $(BUILD)/skv
	cp $< $@
	$(if $(CUDA_SO),cp $(CUDA_SO) libskv-cuda.so)

# A random-weight model made by skv synth (not committed): a fixture for the
# tests and the fuzz seeds. The inspector's default is the trained demo model
# in samples/model/.
$(BUILD)/default-model.gguf: $(BUILD)/skv samples/default-model.config.json
	$(BUILD)/skv synth --config samples/default-model.config.json --dtype f32 --seed 7 -o $@ --force

$(BUILD)/skv: $(TUI_OBJ) $(BUILD)/libskv.a | $(CUDA_SO)
	$(CC) $(CFLAGS) -o $@ $(TUI_OBJ) $(BUILD)/libskv.a $(LDLIBS)

# The CUDA backend's shared object; the calls it makes into skv (skv_error,
# the quant helpers) are resolved from the executable when it is loaded.
$(BUILD)/libskv-cuda.so: $(CUDA_SO_OBJ)
	$(CC) -shared -o $@ $^ $(CUDA_SO_LIBS)

$(BUILD)/kernels/cuda/%.o: CFLAGS += -fPIC

$(BUILD)/libskv.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu $(wildcard kernels/cuda/*.h) kernels/kmath.h kernels/backend.h
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(addprefix -I,$(INC_DIRS)) -c $< -o $@

$(BUILD)/tests/%: tests/%.c tests/testhelp.h tests/batchhelp.h $(BUILD)/libskv.a $(TUI_OBJ) | $(CUDA_SO)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libskv.a $(LDLIBS) $(TEST_RPATH)

$(SIM_DIR)/cuda/%.o: kernels/cuda/%.cu $(wildcard kernels/cuda/*.h) kernels/kmath.h \
                     kernels/backend.h $(wildcard tests/cusim/*.h tests/cusim/include/*.h tests/cusim/include/cub/*)
	@mkdir -p $(dir $@)
	$(SIM_CXX) $(SIM_CXXFLAGS) $(SIM_KFLAGS) -x c++ -c $< -o $@

$(SIM_DIR)/%.o: tests/cusim/%.cpp $(wildcard tests/cusim/*.h tests/cusim/include/*.h tests/cusim/include/cub/*)
	@mkdir -p $(dir $@)
	$(SIM_CXX) $(SIM_CXXFLAGS) -c $< -o $@

$(SIM_DIR)/backend.o: kernels/backend.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DSKV_HAVE_CUDA -DSKV_CUDA_STATIC -c $< -o $@

$(SIM_DIR)/backend_cuda.o: kernels/cuda/backend_cuda.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DSKV_HAVE_CUDA -c $< -o $@

$(SIM_DIR)/libskv.a: $(SIM_BASE_OBJ) $(SIM_C_OBJ) $(SIM_CU_OBJ) $(SIM_RT_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(SIM_DIR)/tests/%: tests/%.c tests/testhelp.h tests/batchhelp.h tests/cusim/cusim_api.h $(SIM_DIR)/libskv.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DSKV_HAVE_CUDA -DSKV_CUSIM -Itests -Itests/cusim -o $@ $< $(SIM_DIR)/libskv.a $(SIM_LDLIBS) -lstdc++

# skv with its CUDA backend on the simulator (tests/sim/test_gpu_steps.sh).
$(SIM_DIR)/skv: $(TUI_OBJ) $(SIM_DIR)/libskv.a
	$(CC) $(CFLAGS) -o $@ $(TUI_OBJ) $(SIM_DIR)/libskv.a $(SIM_LDLIBS) -lstdc++

# A simulator test with kernels of its own (tests/sim/*.cu): compiled like kernels/cuda/.
$(SIM_DIR)/tests/%: tests/%.cu tests/testhelp.h tests/sim/sim_child.h $(SIM_DIR)/libskv.a
	@mkdir -p $(dir $@)
	$(SIM_CXX) $(SIM_CXXFLAGS) -Itests -Ikernels/cuda $(SIM_KFLAGS) -x c++ -c $< -o $@.o
	$(CC) $(CFLAGS) -o $@ $@.o $(SIM_DIR)/libskv.a $(SIM_LDLIBS) -lstdc++

# The fuzz harnesses' regression corpus, replayed by make test: the harnesses
# are included whole, and fuzz_cli needs the command line's parsers (tui/).
TUI_LIB_OBJ = $(filter-out $(BUILD)/tui/main.o,$(TUI_OBJ))
$(BUILD)/tests/test_fuzz_regress: tests/test_fuzz_regress.c tests/testhelp.h $(wildcard tests/fuzz/*) \
                                  $(BUILD)/libskv.a $(TUI_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -Itests/fuzz -o $@ $< $(TUI_LIB_OBJ) $(BUILD)/libskv.a $(LDLIBS)

# libFuzzer harnesses (tests/fuzz/), built with clang into build-fuzz/:
# make fuzz FUZZ_SECONDS=N runs each for N seconds on a corpus made from the
# sample model and small synthetic files (tests/fuzz/seeds.sh) plus the
# regression corpus; a crash stops the run and leaves build-fuzz/crash-*.
FUZZ_SECONDS ?= 60
FUZZ_SRC = $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN = $(FUZZ_SRC:tests/fuzz/%.c=build-fuzz/%)
# (CUDA=0: no harness reaches the CUDA backend; nvcc would only add minutes.)
FUZZ_FLAGS = BUILD=build-fuzz CC=clang CUDA=0 OPT="-O1 -g -fno-omit-frame-pointer -march=native" \
             SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
# The inspector's threads (worker, UI, probe ring, store) under
# ThreadSanitizer: a live session run to the end while the UI switches views.
.PHONY: tsan
tsan:
	@$(MAKE) --no-print-directory BUILD=build-tsan OPT="-O1 -g -fno-omit-frame-pointer -march=native" \
	  SAN="-fsanitize=thread" build-tsan/skv
	@$(MAKE) --no-print-directory build/default-model.gguf
	@sh tests/tsan.sh

# The line coverage of make test (tests/coverage.sh): the suite on a build
# with gcc's --coverage in build-cov/ (CPU backend; the CUDA files run on the
# simulator apart), then build-cov/coverage.txt: each file's lines run and
# every function no test called. Not part of CI; about 25 minutes on 2 cores.
.PHONY: coverage
coverage:
	@find build-cov -name '*.gcda' -delete 2>/dev/null || true
	-@$(MAKE) --no-print-directory test BUILD=build-cov CUDA=0 OPT="-O1 -g --coverage -march=native"
	@sh tests/coverage.sh build-cov

.PHONY: fuzz fuzz-build
fuzz-build:
	@$(MAKE) --no-print-directory $(FUZZ_FLAGS) build-fuzz/libskv.a build-fuzz/skv $(FUZZ_BIN)

build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h build-fuzz/libskv.a $(TUI_OBJ)
	clang $(filter-out -fsanitize=fuzzer-no-link%,$(CFLAGS)) -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=undefined -Itests/fuzz -o $@ $< $(TUI_LIB_OBJ) build-fuzz/libskv.a $(LDLIBS)

fuzz: fuzz-build
	@sh tests/fuzz/run.sh $(FUZZ_SECONDS)

# Tests run from the project root so that ../shared and samples/ resolve.
# The Python tests drive the skv binary (skv eval, the CSV export against
# probes/python/skvtrace) with Debian's python3 and numpy.
PY_TESTS = tests/test_eval.py tests/test_skvtrace.py tests/test_pywriter.py tests/test_pytorch_recorder.py tests/test_gpu_check.py tests/test_chrome.py \
           tests/test_runner.py tests/test_recorder_agree.py tests/test_bench_quiet.sh tests/test_bench_cli.sh \
           tests/test_figures.sh tests/test_cuda_so.sh tests/test_hf_norms.py
# make test TESTS="quant fixes eval.py" runs only the tests named (NAME is
# tests/test_NAME.c, or tests/test_NAME.py); make test-fast runs all but
# SLOW_TESTS, the ones that take minutes (times: README, Tests).
# tests/run.sh gives each test SKV_TEST_TIMEOUT seconds (default 900) and runs
# SKV_TEST_JOBS of them at a time (default: the CPUs, at most 4).
SLOW_TESTS = needle batch fixes claims needle_fixes eval.py recorder_agree.py bench_cli.sh figures.sh
# The simulated CUDA tests (tests/gpu/, tests/sim/, on tests/cusim) run too
# (`make sim-model` runs the two whole-model ones alone).
SIM_MODEL     = $(SIM_DIR)/tests/gpu/test_cuda_model $(SIM_DIR)/tests/sim/test_cuda_paths
SIM_TESTS_RUN = $(SIM_TEST_BIN) tests/sim/test_gpu_steps.sh
# The slow ones first, so that tests/run.sh's parallel jobs (SKV_TEST_JOBS)
# do not end on one of them alone.
TESTS_LISTED = $(TEST_BIN) $(SIM_TESTS_RUN) $(PY_TESTS)
TESTS_LONG = $(SIM_MODEL) $(foreach t,$(SLOW_TESTS),$(filter %/test_$(t),$(TESTS_LISTED)))
ALL_TESTS = $(TESTS_LONG) $(filter-out $(TESTS_LONG),$(TESTS_LISTED))
test_pick = $(or $(filter %/test_$(1) %/test_$(1).py,$(ALL_TESTS)),$(error TESTS: no test '$(1)' (tests/test_$(1).c or .py)))
RUN_TESTS = $(if $(strip $(TESTS)),$(foreach t,$(TESTS),$(call test_pick,$(t))),$(ALL_TESTS))
FAST_TESTS = $(filter-out $(SLOW_TESTS),$(patsubst test_%,%,$(notdir $(ALL_TESTS))))
# With the CUDA backend, the device binaries too: tests/test_gpu_check.py packs
# and runs them on the CPU fallback (they find no device and say so);
# bench_proj on the simulator for tests/sim/test_gpu_steps.sh.
GPU_CHECK_BIN = $(if $(CUDA_SO),$(addprefix $(BUILD)/tests/gpu/,test_cuda_ops test_cuda_model bench_proj))
test: $(filter $(BUILD)/%,$(RUN_TESTS)) $(BUILD)/skv $(BUILD)/default-model.gguf $(SIM_DIR)/skv \
      $(SIM_DIR)/tests/gpu/bench_proj $(GPU_CHECK_BIN)
	@SKV_BIN=$(abspath $(BUILD))/skv sh tests/run.sh $(RUN_TESTS)
test-fast:
	@$(MAKE) --no-print-directory test TESTS="$(FAST_TESTS)"

.PHONY: sim-model
sim-model: $(SIM_MODEL) $(BUILD)/default-model.gguf
	@sh tests/run.sh $(SIM_MODEL)

# Benchmarks: skv beside llama.cpp's llama-bench run live (make bench-ref
# builds it once into build/ref/ from the source pinned in the npm package
# node-llama-cpp; when that fails the bench says so and runs without it), and
# ./skv beside a build whose probe points are compiled out.
bench: skv
	@sh tests/bench_ref.sh || true
	@$(MAKE) --no-print-directory BUILD=build-noprobes EXTRA_CFLAGS=-DSKV_NO_PROBES build-noprobes/skv >/dev/null
	@sh tests/bench.sh

# One prepared command for a device machine (tests/gpu/run.sh: every step
# under a timeout, done within 9 minutes, results in $OUT): a portable build
# with OpenBLAS GEMMs packed by tests/gpu/pack.sh into build/gpu-check/
# (skv-gpu.tar.xz under 20 MiB with its libraries and libskv-cuda.so, and
# gpu-check.sh). Needs
# ../shared/configs/llama-3.1-8b.config.json for the 8B shape's benches.
.PHONY: gpu-check
gpu-check:
	@$(MAKE) --no-print-directory BUILD=build-gpu DNNL=0 OPT="-O2 -march=x86-64-v3 -fvect-cost-model=dynamic" \
	  build-gpu/skv $(addprefix build-gpu/tests/gpu/,test_cuda_ops test_cuda_model bench_proj)
	@sh tests/gpu/pack.sh

.PHONY: bench-ref
bench-ref:
	@sh tests/bench_ref.sh

# The table of docs/PEERS.md, measured on the demo model (tests/peers_table.sh;
# several minutes). Written between the file's markers, through a temp file.
peers-table: skv
	@sh tests/peers_table.sh > build/peers-table.md
	@awk 'FNR == NR { t = t $$0 "\n"; next } /<!-- peers-table begin -->/ { print; printf "%s", t; skip = 1; next } \
	     /<!-- peers-table end -->/ { skip = 0 } !skip' build/peers-table.md docs/PEERS.md > docs/PEERS.md.tmp
	@mv docs/PEERS.md.tmp docs/PEERS.md
	@echo "docs/PEERS.md: table updated"

# The demo suite's leaderboard and figures in docs/EVAL.md (tests/eval_demo.sh;
# about 13 minutes; resumable).
eval-demo: skv
	@sh tests/eval_demo.sh

# Every figure of README.md and docs/, from the demo model (tests/figures.sh).
figures: skv
	@sh tests/figures.sh

asan:
	$(MAKE) SANITIZE=1 test

deps:
	@SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	$$SUDO apt-get update -qq && \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	  build-essential pkg-config libncurses-dev libcjson-dev libpng-dev libopenblas-dev \
	  liblapacke-dev libpcre2-dev libfreetype-dev fonts-dejavu-core tmux clang libclang-rt-14-dev libomp-dev \
	  python3 python3-numpy python3-pandas python3-torch python3-regex libdnnl-dev nodejs && \
	{ command -v npm >/dev/null 2>&1 || $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm; }
	@# Chrome DevTools' trace engine, which tests/test_chrome.py loads the Perfetto/Chrome export with
	@# (pinned by tests/trace-consumer/package-lock.json; a NodeSource nodejs brings its own npm)
	@npm ci --prefix tests/trace-consumer --ignore-scripts --no-audit --no-fund --loglevel=error

clean:
	rm -rf build build-asan build-noprobes build-fuzz build-tsan build-gpu skv libskv-cuda.so

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
