# kernels/: CPU attention and FFN kernels -> $(BUILD)/lib/libsbkernels.a.
# Included by the top Makefile, which defines BUILD, CC, CFLAGS_ALL, INC, Q
# and links EXTRA_A into tests and benchmarks.
#
# Only files named *_avx2.c, *_avx512.c, *_avx512bf16.c are compiled with
# those instruction sets, so nothing else can pick up an instruction the
# CPU may lack; dispatch.c checks CPUID before calling into them.

KERNELS_SRC := $(wildcard kernels/*.c)
KERNELS_OBJ := $(KERNELS_SRC:%.c=$(BUILD)/obj/%.o)
KERNELS_HDR := $(wildcard kernels/*.h kernels/include/*.h)
KERNELS_A := $(BUILD)/lib/libsbkernels.a

KERNELS_AVX2 := -mavx2 -mfma -mf16c
KERNELS_AVX512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c
KERNELS_AVX512BF16 := $(KERNELS_AVX512) -mavx512bf16

EXTRA_A += $(KERNELS_A)
EXTRA_ALL += $(KERNELS_A)

# This file is included before the top Makefile's first target: keep our
# archive rule from becoming the default goal.
KERNELS_GOAL := $(.DEFAULT_GOAL)

# GNU make picks the pattern rule with the shortest stem, so these win over
# the generic $(BUILD)/obj/%.o wherever they are defined.
define KERNELS_CC
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS_ALL) $(INC) -fvisibility=hidden $(1) -c -o $@ $<
endef

$(BUILD)/obj/kernels/%_avx512bf16.o: kernels/%_avx512bf16.c $(KERNELS_HDR)
	$(call KERNELS_CC,$(KERNELS_AVX512BF16))

$(BUILD)/obj/kernels/%_avx512.o: kernels/%_avx512.c $(KERNELS_HDR)
	$(call KERNELS_CC,$(KERNELS_AVX512))

$(BUILD)/obj/kernels/%_avx2.o: kernels/%_avx2.c $(KERNELS_HDR)
	$(call KERNELS_CC,$(KERNELS_AVX2))

$(BUILD)/obj/kernels/%.o: kernels/%.c $(KERNELS_HDR)
	$(call KERNELS_CC,)

$(KERNELS_A): $(KERNELS_OBJ)
	@mkdir -p $(dir $@)
	@echo "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

kernels: $(KERNELS_A)
.PHONY: kernels

.DEFAULT_GOAL := $(KERNELS_GOAL)
