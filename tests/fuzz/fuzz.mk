# tests/fuzz/: libFuzzer harnesses for everything that reads outside input
# (save files, KV save files, llama2.c checkpoints and tokenizers, the
# sampler's settings, flash checkpoints, SPARSEBUF_* variables, the
# programs' command lines, sparsebufd's messages).
# Included by the top Makefile.
#
#   make fuzz          every harness built with clang (libFuzzer, ASan,
#                      UBSan) in build-fuzz/, then tests/fuzz/run.sh: replay
#                      the corpus, replay the known crashes (reported, not
#                      fatal), fuzz each for FUZZ_SECONDS (default 60),
#                      FUZZ_JOBS (default 1) harnesses at a time
#   make fuzz-seeds    rewrite the seeds (tests/fuzz/mkseeds.c)
#   make fuzz-replay   the harnesses as plain programs (tests/fuzz/replay.c,
#                      $(CC), no clang) run once over the corpus
#
# The corpus (tests/fuzz/corpus/NAME/) is seeds and past finds, replayed by
# both; tests/fuzz/crashes/NAME/ holds reproducers of bugs not fixed yet:
# move a file into the corpus once it passes (run.sh says which do).

# One harness per tests/fuzz/fuzz_NAME.c.
FUZZ_NAMES := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 1
FUZZ_CC ?= clang

FUZZ_GOAL := $(.DEFAULT_GOAL)

FUZZ_INC := $(INC) -Ilib -Icommon
FUZZ_DEPS := tests/fuzz/fuzz.h $(LIB_A) $(FLASH_A) $(RUNNER_OBJ) $(COMMON_A) $(KERNELS_A) \
	$(wildcard lib/*.h lib/*.c lib/include/*.h runner/*.h flash/*.h common/*.h)
FUZZ_LINK = $(RUNNER_OBJ) $(FLASH_A) $(KERNELS_A) $(COMMON_A) $(LIB_A) $(LIBS) -lm

# In the clang build (FUZZ_CLANG=1, set by the sub-make below):
# kernels/dispatch.c does not build with clang 14, which rejects
# __builtin_cpu_supports("f16c"); it only picks variants, so it is built
# by gcc, uninstrumented, and every kernel it calls is clang's, under
# ASan and UBSan like the rest.
ifeq ($(FUZZ_CLANG),1)
$(BUILD)/obj/kernels/dispatch.o: kernels/dispatch.c $(KERNELS_HDR)
	@mkdir -p $(dir $@)
	@echo "  CC      $< (gcc)"
	$(Q)gcc -std=gnu11 $(OPT) -g $(WARN) -D_GNU_SOURCE -fPIC $(INC) \
		-fvisibility=hidden -c -o $@ $<
endif

# Both rules run in a sub-make whose BUILD is the fuzz build.
$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_DEPS)
	@mkdir -p $(dir $@)
	@echo "  FUZZ    $@"
	$(Q)$(CC) $(CFLAGS_ALL) -fsanitize=fuzzer $(FUZZ_INC) -o $@ $< \
		$(LDFLAGS_ALL) -fsanitize=fuzzer $(FUZZ_LINK)

$(BUILD)/fuzz-replay/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(FUZZ_DEPS)
	@mkdir -p $(dir $@)
	@echo "  CCLD    $@"
	$(Q)$(CC) $(CFLAGS_ALL) $(FUZZ_INC) -o $@ $< tests/fuzz/replay.c \
		$(LDFLAGS_ALL) $(FUZZ_LINK)

# fuzz_dmsg fuzzes sparsebufd (daemon/): it links the daemon's objects but
# its main() (sparsebufd.c), and lib/dproto.o, not the library. Explicit
# rules: they win over the patterns above.
FUZZ_DMSG_OBJ := $(addprefix $(BUILD)/obj/,daemon/loop.o daemon/server.o \
	daemon/budget.o daemon/cache.o lib/dproto.o)
FUZZ_DMSG_DEPS := tests/fuzz/fuzz.h $(FUZZ_DMSG_OBJ) $(wildcard daemon/*.h) \
	lib/dproto.h

$(BUILD)/fuzz/fuzz_dmsg: tests/fuzz/fuzz_dmsg.c $(FUZZ_DMSG_DEPS)
	@mkdir -p $(dir $@)
	@echo "  FUZZ    $@"
	$(Q)$(CC) $(CFLAGS_ALL) -fsanitize=fuzzer $(FUZZ_INC) -o $@ $< \
		$(LDFLAGS_ALL) -fsanitize=fuzzer $(FUZZ_DMSG_OBJ)

$(BUILD)/fuzz-replay/fuzz_dmsg: tests/fuzz/fuzz_dmsg.c tests/fuzz/replay.c $(FUZZ_DMSG_DEPS)
	@mkdir -p $(dir $@)
	@echo "  CCLD    $@"
	$(Q)$(CC) $(CFLAGS_ALL) $(FUZZ_INC) -o $@ $< tests/fuzz/replay.c \
		$(LDFLAGS_ALL) $(FUZZ_DMSG_OBJ)

# The seed writer (tests/fuzz/mkseeds.c), no fuzzer runtime.
$(BUILD)/fuzz/mkseeds: tests/fuzz/mkseeds.c $(FUZZ_DEPS)
	@mkdir -p $(dir $@)
	@echo "  CCLD    $@"
	$(Q)$(CC) $(CFLAGS_ALL) $(FUZZ_INC) -o $@ $< $(LDFLAGS_ALL) $(FUZZ_LINK)

fuzz-bin: $(FUZZ_NAMES:%=$(BUILD)/fuzz/fuzz_%)
fuzz-replay-bin: $(FUZZ_NAMES:%=$(BUILD)/fuzz-replay/fuzz_%)

# clang and its sanitizer/fuzzer runtime (not part of Debian's clang-14
# dependencies), llvm-14 for llvm-symbolizer (stacks with file:line).
deps-fuzz:
	@scripts/deps.sh clang libclang-rt-14-dev llvm-14

FUZZ_SUBMAKE = $(MAKE) --no-print-directory CC=$(FUZZ_CC) SAN=asan \
	BUILD=$(FUZZ_BUILD) CFLAGS=-fsanitize=fuzzer-no-link FUZZ_CLANG=1

fuzz: fuzz-build
	@FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=$(FUZZ_JOBS) \
		tests/fuzz/run.sh $(FUZZ_BUILD)/fuzz

# The harnesses alone (.ci/run builds them while another suite runs).
fuzz-build: deps-fuzz
	@+$(FUZZ_SUBMAKE) fuzz-bin

fuzz-seeds: deps-fuzz
	@+$(FUZZ_SUBMAKE) $(FUZZ_BUILD)/fuzz/mkseeds
	@$(FUZZ_BUILD)/fuzz/mkseeds tests/fuzz/corpus

fuzz-replay:
	@$(MAKE) --no-print-directory SAN=asan BUILD=$(FUZZ_BUILD)-replay \
		fuzz-replay-bin
	@FUZZ_SECONDS=0 tests/fuzz/run.sh $(FUZZ_BUILD)-replay/fuzz-replay

# make clean removes the fuzz builds too.
clean: clean-fuzz
clean-fuzz:
	rm -rf $(FUZZ_BUILD) $(FUZZ_BUILD)-replay

.PHONY: fuzz fuzz-build fuzz-bin fuzz-seeds clean-fuzz fuzz-replay fuzz-replay-bin \
	deps-fuzz

.DEFAULT_GOAL := $(FUZZ_GOAL)
