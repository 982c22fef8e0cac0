# common/: what every program shares: the command-line convention and its
# strict value parsers (cli.c), careful input and output files (file.c).
# -> $(BUILD)/lib/libsbcommon.a, linked into the programs, tests and
# benchmarks through EXTRA_A. Included by the top Makefile first, so that
# the other fragments' archives come before it in link order.

COMMON_SRC := $(wildcard common/*.c)
COMMON_OBJ := $(COMMON_SRC:%.c=$(BUILD)/obj/%.o)
COMMON_HDR := $(wildcard common/*.h)
COMMON_A := $(BUILD)/lib/libsbcommon.a

INC += -Icommon
EXTRA_A += $(COMMON_A)
EXTRA_ALL += $(COMMON_A)

COMMON_GOAL := $(.DEFAULT_GOAL)

$(BUILD)/obj/common/%.o: common/%.c $(COMMON_HDR) lib/include/sparsebuf.h
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS_ALL) $(INC) -c -o $@ $<

$(COMMON_A): $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	@echo "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

common: $(COMMON_A)
.PHONY: common

.DEFAULT_GOAL := $(COMMON_GOAL)
