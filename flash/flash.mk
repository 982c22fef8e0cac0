# flash/: the LLM-in-a-flash demo. sbgen writes synthetic checkpoints,
# sbflash runs them (resident, flash, mmap_dense, mmap_sparse). The shared
# code goes into libsbflash.a, which tests link too; it uses common/ (the
# command line, careful files). Included by the top Makefile after
# common/common.mk and kernels/kernels.mk.

FLASH_LIB_SRC := flash/model.c flash/gen.c flash/runner.c
FLASH_LIB_OBJ := $(FLASH_LIB_SRC:%.c=$(BUILD)/obj/%.o)
FLASH_HDR := $(wildcard flash/*.h)
FLASH_A := $(BUILD)/lib/libsbflash.a
FLASH_BIN := $(BUILD)/bin/sbgen $(BUILD)/bin/sbflash

# Before the kernels in link order: libsbflash calls into libsbkernels.
EXTRA_A := $(FLASH_A) $(EXTRA_A)
EXTRA_ALL += $(FLASH_A) $(FLASH_BIN)

FLASH_GOAL := $(.DEFAULT_GOAL)

$(BUILD)/obj/flash/%.o: flash/%.c $(FLASH_HDR) $(COMMON_HDR) $(wildcard lib/include/*.h kernels/include/*.h)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS_ALL) $(INC) -c -o $@ $<

$(FLASH_A): $(FLASH_LIB_OBJ)
	@mkdir -p $(dir $@)
	@echo "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

define FLASH_LD
	@mkdir -p $(dir $@)
	@echo "  CCLD    $@"
	$(Q)$(CC) $(CFLAGS_ALL) -o $@ $< $(LDFLAGS_ALL) $(FLASH_A) $(KERNELS_A) $(COMMON_A) $(LIB_A) $(LIBS) -lm
endef

$(BUILD)/bin/sbgen: $(BUILD)/obj/flash/sbgen.o $(FLASH_A) $(KERNELS_A) $(COMMON_A) $(LIB_A)
	$(FLASH_LD)

$(BUILD)/bin/sbflash: $(BUILD)/obj/flash/sbflash.o $(FLASH_A) $(KERNELS_A) $(COMMON_A) $(LIB_A)
	$(FLASH_LD)

flash: $(FLASH_BIN)
.PHONY: flash

.DEFAULT_GOAL := $(FLASH_GOAL)
