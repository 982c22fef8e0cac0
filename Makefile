# sparsebuf: plain Makefile, quiet by default (V=1 shows the commands).
#
#   make            library, tools, tests, benchmarks, demo
#   make test       build and run every test
#   make demo       build and run the demo
#   make asan       tests under AddressSanitizer + UBSan (build-asan/)
#   make tsan       tests under ThreadSanitizer (build-tsan/)
#   make test-folios  tests with huge heap folios (shmem_enabled, restored)
#   make test-flip    test_chaos while shmem_enabled flips (restored)
#   make fuzz       libFuzzer harnesses, FUZZ_SECONDS each (build-fuzz/)
#   make bench      run the benchmarks
#   make bench-pagein  just the disk-tier benchmark (PAGEIN_ARGS=--quick)
#   make install    PREFIX=/usr/local DESTDIR=
#   make format     clang-format every source file

PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
INCDIR ?= $(PREFIX)/include
BINDIR ?= $(PREFIX)/bin
SAN ?=
# The lock rules checked (lib/lockcheck.c): every pthread lock call goes
# through a wrapper that knows each thread's locks and their order.
LOCK_WRAP := pthread_mutex_lock pthread_mutex_trylock pthread_mutex_unlock \
	pthread_mutex_destroy pthread_rwlock_rdlock pthread_rwlock_wrlock \
	pthread_rwlock_tryrdlock pthread_rwlock_trywrlock pthread_rwlock_unlock \
	pthread_rwlock_destroy
LOCKFLAGS := -DSBI_LOCK_DEBUG $(foreach f,$(LOCK_WRAP),-Wl,--wrap=$(f))
ifeq ($(SAN),asan)
BUILD ?= build-asan
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
else ifeq ($(SAN),asan-lockcheck)
# Both in one build and one run of the suite (CI: one suite less).
BUILD ?= build-asan-lockcheck
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined \
	-fno-omit-frame-pointer $(LOCKFLAGS)
else ifeq ($(SAN),tsan)
BUILD ?= build-tsan
SANFLAGS := -fsanitize=thread
else ifeq ($(SAN),lockcheck)
BUILD ?= build-lockcheck
SANFLAGS := $(LOCKFLAGS)
else
BUILD ?= build
SANFLAGS :=
endif

SOVERSION := 0
VERSION := $(shell sed -n 's/^#define SPARSEBUF_VERSION_STRING "\(.*\)"/\1/p' lib/include/sparsebuf.h)
CC ?= cc
OPT ?= -O2
WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes
CFLAGS_ALL := -std=gnu11 $(OPT) -g $(WARN) -D_GNU_SOURCE -fPIC $(SANFLAGS) $(CFLAGS)
LIBS := -luring -lnuma -lpthread
comma := ,
LDFLAGS_ALL := $(SANFLAGS) $(LDFLAGS)
# A program of the shared library's: its lock wrappers are the library's
# own (with ASan, --wrap here would also rename the library's imports).
LDFLAGS_SO_USER := $(filter-out -Wl$(comma)--wrap=%,$(LDFLAGS_ALL))

ifeq ($(V),1)
Q :=
else
Q := @
endif

LIB_SRC := $(wildcard lib/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
LIB_A := $(BUILD)/lib/libsparsebuf.a
LIB_SO := $(BUILD)/lib/libsparsebuf.so.$(VERSION)
TEST_SRC := $(wildcard tests/*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_SRC := $(wildcard bench/*.c)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
TOOLS := $(BUILD)/bin/sparsebuf-info $(BUILD)/bin/sparsebuf-stat $(BUILD)/bin/sparsebuf-demo $(BUILD)/bin/sbrun
INC := -Ilib/include -Ikernels/include
RUNNER_OBJ := $(BUILD)/obj/runner/model.o

# Components in their own fragments add static libraries to EXTRA_A (linked
# into tests, benchmarks and tools after libsparsebuf) and targets to
# EXTRA_ALL. common/ (the programs' command line and files) comes first:
# the others' archives, linked before it, call into it.
EXTRA_A :=
EXTRA_ALL :=
include common/common.mk
include kernels/kernels.mk
include flash/flash.mk
include daemon/daemon.mk
include tests/fuzz/fuzz.mk

# Dependencies first, then a sub-make: under make -j nothing compiles
# before the headers it needs are installed.
all: deps-check
	@$(MAKE) --no-print-directory build-all

build-all: lib $(TOOLS) tests bench-bin $(EXTRA_ALL) man

# Man pages: section 3 from the public headers' comments (one page per
# function), section 1 from each tool's --help, section 7 written by hand.
MAN_DATE := 2026-11-25
MAN1_TOOLS := $(BUILD)/bin/sparsebuf-info $(BUILD)/bin/sparsebuf-stat $(BUILD)/bin/sbrun $(FLASH_BIN) $(DAEMON_BIN)
man: $(BUILD)/man/.stamp
$(BUILD)/man/.stamp: lib/include/sparsebuf.h lib/include/sparsebuf_kv.h \
		scripts/mkman3.awk scripts/mkman1.sh man/sparsebuf.7 $(MAN1_TOOLS)
	@echo "  MAN     $(BUILD)/man"
	@rm -rf $(BUILD)/man && mkdir -p $(BUILD)/man/man3 $(BUILD)/man/man7
	$(Q)for h in sparsebuf.h sparsebuf_kv.h; do \
		awk -v outdir=$(BUILD)/man/man3 -v hdr=$$h -v version=$(VERSION) \
			-v date=$(MAN_DATE) -f scripts/mkman3.awk lib/include/$$h 2>/dev/null || exit 1; \
	done
	$(Q)scripts/mkman1.sh $(BUILD)/man/man1 $(VERSION) $(MAN_DATE) $(MAN1_TOOLS)
	$(Q)cp man/sparsebuf.7 $(BUILD)/man/man7/
	@touch $@

lib: $(LIB_A) $(LIB_SO)
tests: $(TEST_BIN)
bench-bin: $(BENCH_BIN)

# lib/trace.h compiles the USDT probes in only where <sys/sdt.h> is (an
# optional package): objects built before it was installed would keep
# none, and perf would find no probe. A stamp named after its presence,
# made when the Makefile is read if it is not there (every target is
# .SECONDARY, so a missing one would not count), rebuilds them when that
# changes.
HAVE_SDT := $(shell echo '\#include <sys/sdt.h>' | \
	$(CC) -E -x c - >/dev/null 2>&1 && echo yes || echo no)
SDT_STAMP := $(BUILD)/.sdt-$(HAVE_SDT)
ifneq ($(filter-out deps-% clean format,$(or $(MAKECMDGOALS),all)),)
$(shell [ -f $(SDT_STAMP) ] || { mkdir -p $(BUILD) && \
	rm -f $(BUILD)/.sdt-* && touch $(SDT_STAMP); })
endif
$(LIB_OBJ): $(SDT_STAMP)

$(BUILD)/obj/%.o: %.c $(wildcard lib/*.h lib/include/*.h tests/*.h)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS_ALL) $(INC) -fvisibility=hidden -c -o $@ $<

$(LIB_A): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@echo "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIB_SO): $(LIB_OBJ) lib/sparsebuf.map
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) -shared -Wl,-soname,libsparsebuf.so.$(SOVERSION) \
		-Wl,--version-script=lib/sparsebuf.map $(LDFLAGS_ALL) -o $@ $(LIB_OBJ) $(LIBS)
	$(Q)ln -sf libsparsebuf.so.$(VERSION) $(BUILD)/lib/libsparsebuf.so.$(SOVERSION)
	$(Q)ln -sf libsparsebuf.so.$(SOVERSION) $(BUILD)/lib/libsparsebuf.so

# Tests and tools link the static library: one binary per test, no
# LD_LIBRARY_PATH, same under the sanitizers. test_shared links the .so.
$(BUILD)/tests/test_shared: tests/test_shared.c $(LIB_SO) tests/harness.h
	@mkdir -p $(dir $@)
	@echo "  CCLD    $@"
	$(Q)$(CC) $(filter-out -Wl$(comma)--wrap=%,$(CFLAGS_ALL)) $(INC) -o $@ $< \
		$(LDFLAGS_SO_USER) -L$(BUILD)/lib \
		-Wl,-rpath,$(abspath $(BUILD)/lib) -lsparsebuf -lpthread

$(BUILD)/tests/%: tests/%.c $(LIB_A) $(EXTRA_A) $(RUNNER_OBJ) tests/harness.h tests/harness_internal.h $(COMMON_HDR)
	@mkdir -p $(dir $@)
	@echo "  CCLD    $@"
	$(Q)$(CC) $(CFLAGS_ALL) $(INC) -Ilib -Irunner -o $@ $< $(LDFLAGS_ALL) $(RUNNER_OBJ) $(EXTRA_A) $(LIB_A) $(LIBS) -lm

# The static /init of test_numa2's two-node VM (not with sanitizers: their
# runtimes do not link statically).
ifeq ($(SAN),)
NUMA2_GUEST := $(BUILD)/tests/numa2-guest
endif
$(BUILD)/tests/numa2-guest: tests/numa2/guest.c $(LIB_A)
	@mkdir -p $(dir $@)
	@echo "  CCLD    $@"
	$(Q)$(CC) $(CFLAGS_ALL) $(INC) -static -o $@ $< $(LDFLAGS_ALL) $(LIB_A) $(LIBS)

$(BUILD)/bench/%: bench/%.c $(LIB_A) $(EXTRA_A) $(RUNNER_OBJ) $(wildcard bench/*.h) $(COMMON_HDR)
	@mkdir -p $(dir $@)
	@echo "  CCLD    $@"
	$(Q)$(CC) $(CFLAGS_ALL) $(INC) -Irunner -Ilib -o $@ $< $(LDFLAGS_ALL) $(RUNNER_OBJ) $(EXTRA_A) $(LIB_A) $(LIBS) -lm

$(BUILD)/bin/sparsebuf-info: tools/sparsebuf-info.c $(LIB_A) $(COMMON_A) $(COMMON_HDR)
	@mkdir -p $(dir $@)
	@echo "  CCLD    $@"
	$(Q)$(CC) $(CFLAGS_ALL) $(INC) -o $@ $< $(LDFLAGS_ALL) $(COMMON_A) $(LIB_A) $(LIBS)

# The llama2.c runner: runner/model.c is shared by sbrun, tests and benches.
$(BUILD)/obj/runner/%.o: runner/%.c runner/model.h $(COMMON_HDR) $(wildcard lib/include/*.h kernels/include/*.h)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS_ALL) $(INC) -Irunner -c -o $@ $<

$(BUILD)/bin/sbrun: runner/sbrun.c $(RUNNER_OBJ) $(LIB_A) $(EXTRA_A)
	@mkdir -p $(dir $@)
	@echo "  CCLD    $@"
	$(Q)$(CC) $(CFLAGS_ALL) $(INC) -Irunner -o $@ $< $(RUNNER_OBJ) $(LDFLAGS_ALL) $(EXTRA_A) $(LIB_A) $(LIBS) -lm

$(BUILD)/bin/sparsebuf-stat: tools/sparsebuf-stat.c lib/stat_page.h $(COMMON_A) $(COMMON_HDR)
	@mkdir -p $(dir $@)
	@echo "  CCLD    $@"
	$(Q)$(CC) $(CFLAGS_ALL) $(INC) -Ilib -o $@ $< $(LDFLAGS_ALL) $(COMMON_A)

$(BUILD)/bin/sparsebuf-demo: demo/demo.c $(LIB_A) $(COMMON_A) $(COMMON_HDR)
	@mkdir -p $(dir $@)
	@echo "  CCLD    $@"
	$(Q)$(CC) $(CFLAGS_ALL) $(INC) -o $@ $< $(LDFLAGS_ALL) $(COMMON_A) $(LIB_A) $(LIBS)

# Build dependencies; the tests also want perf (test_perf skips without
# it), the benchmarks gnuplot for their charts and fio (bench/pagein's
# baseline).
# Plain make installs nothing (and needs no dpkg): it checks for the
# headers and libraries; make test, make demo and make bench install what
# is missing on Debian.
deps-check:
	@scripts/deps.sh --check

deps-test:
	@scripts/deps.sh linux-perf --optional qemu-system-x86 linux-image-amd64

deps-bench:
	@scripts/deps.sh linux-perf gnuplot-nox fio

# Dependencies first (a sub-make, so that even make -j builds after them).
# The build uses every CPU unless make was given -j itself.
NPROC := $(shell nproc 2>/dev/null || echo 1)
test: deps-test
	@$(MAKE) --no-print-directory $(if $(filter -j%,$(MAKEFLAGS)),,-j$(NPROC)) test-build
	@scripts/layers.sh $(BUILD)
	@tests/run.sh $(BUILD)/tests

# The suite again with every default pool a client of sparsebufd.
test-daemon: test-build
	@scripts/test-daemon.sh $(BUILD)

# The suite again with huge folios in the heaps (shmem_enabled=within_size,
# set for the run and restored; skipped where it cannot be); test_stress
# at 20k of its million cycles (make test runs them all; the same paths).
test-folios: test-build
	@SB_STRESS_CYCLES=$${SB_STRESS_CYCLES:-20000} scripts/test-folios.sh $(BUILD)

# test_chaos while shmem_enabled flips (scripts/test-flip.sh; the setting
# is the machine's: nothing else runs beside it).
test-flip: test-build
	@scripts/test-flip.sh $(BUILD)

# lib/'s layering (lib/LAYERS) against nm of its objects: no upward call,
# no loop.
layers: lib
	@scripts/layers.sh $(BUILD)

test-build: lib tests $(TOOLS) bench-bin $(EXTRA_ALL) man $(NUMA2_GUEST)

demo: deps-bench
	@$(MAKE) --no-print-directory $(BUILD)/bin/sparsebuf-demo \
		$(BUILD)/bin/sbrun $(BUILD)/bench/kv $(BUILD)/bench/place \
		$(BUILD)/bench/hugewarm $(BUILD)/bench/sessions $(FLASH_BIN) \
		$(DAEMON_BIN) $(BUILD)/bench/daemon
	@demo/run.sh $(BUILD)

asan:
	@ASAN_OPTIONS=$${ASAN_OPTIONS:-abort_on_error=0} \
	SB_STRESS_CYCLES=$${SB_STRESS_CYCLES:-20000} \
		$(MAKE) --no-print-directory SAN=asan test

# The whole suite with the lock order and the locks each function needs
# checked (lib/lockcheck.c); test_stress at 20k of its million cycles
# (make test runs them all; the same paths and locks).
lockcheck:
	@SB_STRESS_CYCLES=$${SB_STRESS_CYCLES:-20000} \
		$(MAKE) --no-print-directory SAN=lockcheck test

# ASan and UBSan with the lock checks: both in one build and one run of
# the suite (CI runs it with huge heap folios: make SAN=asan-lockcheck
# test-folios). test_stress at 20k cycles, as in every suite after the
# first.
asan-lockcheck:
	@ASAN_OPTIONS=$${ASAN_OPTIONS:-abort_on_error=0} \
	SB_STRESS_CYCLES=$${SB_STRESS_CYCLES:-20000} \
		$(MAKE) --no-print-directory SAN=asan-lockcheck test

# die_after_fork=0: fork() tests start threads in the child of a
# threaded parent, which TSan refuses by default. atexit_sleep_ms: TSan
# sleeps a second in every process's exit (for races with threads still
# running then), and the suite starts about 600 processes (children,
# programs, daemons): 50 ms still lets such threads run (test_cli alone
# went from 32 to 16 s).
tsan:
	@TSAN_OPTIONS=$${TSAN_OPTIONS:-die_after_fork=0 atexit_sleep_ms=50} \
	SB_STRESS_CYCLES=$${SB_STRESS_CYCLES:-20000} \
		$(MAKE) --no-print-directory SAN=tsan test

bench: deps-bench
	@$(MAKE) --no-print-directory bench-bin
	@bench/run.sh $(BUILD)

# The disk tier alone: bench/pagein (sequential, random, evict; against fio
# and mmap), the sequential part again on 2 MiB pages (shmem huge folios;
# heaps of huge pages, reserved for the run where it may), and its fault
# counts under perf. PAGEIN_ARGS="--quick" for a smoke run of a few
# seconds; see bench/pagein.c for the options.
bench-pagein: deps-bench
	@$(MAKE) --no-print-directory $(BUILD)/bench/pagein $(BUILD)/bench/hugewarm
	@bench/pagein.sh $(BUILD) $(PAGEIN_ARGS)

# pkg-config files, their paths relative to ${prefix} where they lie under
# it (a relocated tree keeps working). libsbkernels is static only: what
# it needs is in Libs.
pc_path = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))

sparsebuf.pc: Makefile
	@printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(call pc_path,$(LIBDIR))' \
		'includedir=$(call pc_path,$(INCDIR))' '' \
		'Name: sparsebuf' 'Description: placement-sparse buffers over userfaultfd' \
		'Version: $(VERSION)' 'Libs: -L$${libdir} -lsparsebuf' \
		'Libs.private: $(LIBS)' 'Cflags: -I$${includedir}' > $(BUILD)/sparsebuf.pc
	@printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(call pc_path,$(LIBDIR))' \
		'includedir=$(call pc_path,$(INCDIR))' '' \
		'Name: sbkernels' 'Description: CPU attention and FFN kernels over flat KV and weight buffers' \
		'Version: $(VERSION)' 'Libs: -L$${libdir} -lsbkernels -lpthread -lm' \
		'Cflags: -I$${includedir}' > $(BUILD)/sbkernels.pc

# The libraries with their headers (libsbcommon and libsbflash are the
# programs' own internals: not installed), the tools, and the licence.
DOCDIR ?= $(PREFIX)/share/doc/sparsebuf
MANDIR ?= $(PREFIX)/share/man
SYSTEMDDIR ?= $(PREFIX)/lib/systemd/system
install: lib $(KERNELS_A) $(BUILD)/bin/sparsebuf-info $(BUILD)/bin/sparsebuf-stat $(BUILD)/bin/sbrun $(FLASH_BIN) $(DAEMON_BIN) sparsebuf.pc man
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCDIR) $(DESTDIR)$(BINDIR) \
		$(DESTDIR)$(DOCDIR)
	install -m 644 lib/include/sparsebuf.h lib/include/sparsebuf_kv.h \
		kernels/include/sbkernels.h $(DESTDIR)$(INCDIR)/
	install -m 644 $(LIB_A) $(KERNELS_A) $(DESTDIR)$(LIBDIR)/
	install -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/
	ln -sf libsparsebuf.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libsparsebuf.so.$(SOVERSION)
	ln -sf libsparsebuf.so.$(SOVERSION) $(DESTDIR)$(LIBDIR)/libsparsebuf.so
	install -m 644 $(BUILD)/sparsebuf.pc $(BUILD)/sbkernels.pc $(DESTDIR)$(LIBDIR)/pkgconfig/
	install -m 755 $(BUILD)/bin/sparsebuf-info $(BUILD)/bin/sparsebuf-stat $(BUILD)/bin/sbrun $(FLASH_BIN) \
		$(DAEMON_BIN) $(DESTDIR)$(BINDIR)/
	install -d $(DESTDIR)$(SYSTEMDDIR)
	install -m 644 daemon/sparsebufd.socket $(DESTDIR)$(SYSTEMDDIR)/
	sed 's|@BINDIR@|$(BINDIR)|' daemon/sparsebufd.service > $(DESTDIR)$(SYSTEMDDIR)/sparsebufd.service
	chmod 644 $(DESTDIR)$(SYSTEMDDIR)/sparsebufd.service
	install -m 644 LICENSE CHANGELOG.md README.md $(DESTDIR)$(DOCDIR)/
	install -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man3 $(DESTDIR)$(MANDIR)/man7
	install -m 644 $(BUILD)/man/man1/*.1 $(DESTDIR)$(MANDIR)/man1/
	install -m 644 $(BUILD)/man/man3/*.3 $(DESTDIR)$(MANDIR)/man3/
	install -m 644 $(BUILD)/man/man7/*.7 $(DESTDIR)$(MANDIR)/man7/

# examples/ built against an installed copy (a scratch prefix) through
# pkg-config, and run.
examples-check: build-all
	@scripts/examples-check.sh $(BUILD)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-tsan build-lockcheck build-asan-lockcheck


.PHONY: examples-check man lockcheck asan-lockcheck layers test-daemon test-folios \
	test-flip
.PHONY: all build-all lib tests bench-bin deps-check deps-test deps-bench test test-build demo asan tsan bench bench-pagein install format clean sparsebuf.pc
.SECONDARY:
