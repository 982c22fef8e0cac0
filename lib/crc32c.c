/* SPDX-License-Identifier: MIT */
/*
 * CRC-32C (Castagnoli), the checksum of every page the disk tier writes:
 * SSE4.2's crc32 instruction where the CPU has it (8 bytes per cycle or
 * so: a 256 KiB page in ~30 us), else a table, one byte at a time.
 */
#include "internal.h"

#include <string.h>

static uint32_t table[256];

static void make_table(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;

		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		table[i] = c;
	}
}

static uint32_t crc_table(uint32_t crc, const uint8_t *p, size_t len)
{
	while (len--)
		crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t
crc_sse42(uint32_t crc, const uint8_t *p, size_t len)
{
	uint64_t c = crc;

	for (; len >= 8; p += 8, len -= 8) {
		uint64_t v;

		memcpy(&v, p, 8);
		c = __builtin_ia32_crc32di(c, v);
	}
	crc = (uint32_t)c;
	for (; len; p++, len--)
		crc = __builtin_ia32_crc32qi(crc, *p);
	return crc;
}
#endif

static uint32_t (*impl)(uint32_t, const uint8_t *, size_t);

__attribute__((constructor)) static void crc32c_init(void)
{
	make_table();
	impl = crc_table;
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("sse4.2"))
		impl = crc_sse42;
#endif
}

uint32_t sbi_crc32c(const void *p, size_t len)
{
	return ~impl(~0u, p, len);
}

uint32_t sbi_crc32c_sw(const void *p, size_t len)
{
	return ~crc_table(~0u, p, len);
}

uint32_t sbi_crc32c_update(uint32_t crc, const void *p, size_t len)
{
	return ~impl(~crc, p, len);
}

/*
 * Zero bytes: the register's update is linear, so len zero bytes are one
 * 32x32 matrix over GF(2), the one-bit step raised to the power 8 * len,
 * computed by repeated squaring (as zlib's crc32_combine does): a
 * terabyte of holes costs about 40 squarings, not a terabyte of reads.
 */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
	uint32_t sum = 0;

	for (int i = 0; vec; vec >>= 1, i++)
		if (vec & 1)
			sum ^= mat[i];
	return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *mat)
{
	for (int n = 0; n < 32; n++)
		sq[n] = gf2_times(mat, mat[n]);
}

uint32_t sbi_crc32c_zeros(uint32_t crc, uint64_t len)
{
	uint32_t even[32], odd[32], reg = ~crc;

	if (!len)
		return crc;
	/* odd: one zero bit (shift right, reduce by the polynomial). */
	odd[0] = 0x82f63b78u;
	for (int n = 1; n < 32; n++)
		odd[n] = 1u << (n - 1);
	gf2_square(even, odd);	/* two bits */
	gf2_square(odd, even);	/* four bits */
	for (;;) {
		gf2_square(even, odd);	/* 8, 32, ... bits: 1, 4, ... bytes */
		if (len & 1)
			reg = gf2_times(even, reg);
		len >>= 1;
		if (!len)
			break;
		gf2_square(odd, even);	/* 2, 8, ... bytes */
		if (len & 1)
			reg = gf2_times(odd, reg);
		len >>= 1;
		if (!len)
			break;
	}
	return ~reg;
}
