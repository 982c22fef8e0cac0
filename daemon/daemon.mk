# daemon/: sparsebufd, one memory budget for every sparsebuf process on the
# machine (docs/daemon.md), and tools/sparsebufctl, which asks it. Both
# speak lib/dproto.c's protocol and link only that object of the library.
# Included by the top Makefile.

DAEMON_SRC := $(wildcard daemon/*.c)
DAEMON_OBJ := $(DAEMON_SRC:%.c=$(BUILD)/obj/%.o)
DAEMON_BIN := $(BUILD)/bin/sparsebufd $(BUILD)/bin/sparsebufctl
EXTRA_ALL += $(DAEMON_BIN)

DAEMON_GOAL := $(.DEFAULT_GOAL)

$(BUILD)/obj/daemon/%.o: daemon/%.c $(wildcard daemon/*.h) lib/dproto.h $(COMMON_HDR)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS_ALL) $(INC) -Ilib -c -o $@ $<

$(BUILD)/bin/sparsebufd: $(DAEMON_OBJ) $(BUILD)/obj/lib/dproto.o $(COMMON_A)
	@mkdir -p $(dir $@)
	@echo "  CCLD    $@"
	$(Q)$(CC) $(LDFLAGS_ALL) -o $@ $^

$(BUILD)/bin/sparsebufctl: tools/sparsebufctl.c $(BUILD)/obj/lib/dproto.o $(COMMON_A) lib/dproto.h $(COMMON_HDR)
	@mkdir -p $(dir $@)
	@echo "  CCLD    $@"
	$(Q)$(CC) $(CFLAGS_ALL) $(INC) -Ilib -o $@ $< $(LDFLAGS_ALL) $(BUILD)/obj/lib/dproto.o $(COMMON_A)

daemon: $(DAEMON_BIN)
.PHONY: daemon

.DEFAULT_GOAL := $(DAEMON_GOAL)
