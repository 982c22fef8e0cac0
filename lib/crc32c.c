/* SPDX-License-Identifier: MIT */
/*
 * CRC-32C (Castagnoli), the checksum of every page the disk tier writes
 * and reads back: SSE4.2's crc32 instruction where the CPU has it, else a
 * table, one byte at a time. The instruction takes 3 cycles and starts one
 * a cycle, so one chain of it uses a third of what it can do (a 256 KiB
 * page in ~27 us): buffers of 12 KiB or more go as three chains over
 * thirds of the buffer, joined at the end (crc_3way), in a third of the
 * time.
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

static uint32_t zeros_reg(uint32_t reg, uint64_t len);
static void make_x2n(void);

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

/*
 * Three chains over the thirds A, B, C of the buffer: A from the register
 * given, B and C from 0. The register is linear in what it has seen, so
 * the register after A then B is A's run on through len(B) zero bytes
 * (zeros_reg), plus B's: reg(AB) = Z(reg A) ^ reg B, and the same again
 * for C.
 */
__attribute__((target("sse4.2"))) static uint32_t
crc_3way(uint32_t crc, const uint8_t *p, size_t len)
{
	size_t third = len / 3 / 8 * 8;
	const uint8_t *pb = p + third, *pc = p + 2 * third;
	uint64_t a = crc, b = 0, c = 0;
	uint32_t reg;

	if (len < 12 * 1024)
		return crc_sse42(crc, p, len);
	for (size_t i = 0; i < third; i += 8) {
		uint64_t va, vb, vc;

		memcpy(&va, p + i, 8);
		memcpy(&vb, pb + i, 8);
		memcpy(&vc, pc + i, 8);
		a = __builtin_ia32_crc32di(a, va);
		b = __builtin_ia32_crc32di(b, vb);
		c = __builtin_ia32_crc32di(c, vc);
	}
	reg = zeros_reg((uint32_t)a, third) ^ (uint32_t)b;
	reg = zeros_reg(reg, third) ^ (uint32_t)c;
	return crc_sse42(reg, p + 3 * third, len - 3 * third);
}
#endif

static uint32_t (*impl)(uint32_t, const uint8_t *, size_t);

__attribute__((constructor)) static void crc32c_init(void)
{
	make_table();
	make_x2n();
	impl = crc_table;
#if defined(__x86_64__)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("sse4.2"))
		impl = crc_3way;
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
 * Zero bytes: running the register through n zero bytes multiplies it by
 * x^(8n) modulo the polynomial (bit-reflected: bit 31 is x^0). x^(8n) is
 * a product of the powers x^(2^k), made once at start-up (x2n), one per
 * set bit of 8n: a terabyte of holes is 43 products of two 32-bit values,
 * not a terabyte of reads. No cache and no lock: safe in a fork()ed child
 * and at any number of lengths.
 */
static uint32_t x2n[64];	/* x^(2^k) mod P */

static uint32_t mulmod(uint32_t a, uint32_t b)
{
	uint32_t m = 1u << 31, p = 0;

	for (;;) {
		if (a & m) {
			p ^= b;
			if ((a & (m - 1)) == 0)
				break;
		}
		m >>= 1;
		b = b & 1 ? (b >> 1) ^ 0x82f63b78u : b >> 1;
	}
	return p;
}

static uint32_t zeros_reg(uint32_t reg, uint64_t len)
{
	/* x^(8 len) = the product of x^(2^k) over the set bits k of 8 len. */
	for (unsigned k = 3; len && k < 64; len >>= 1, k++)
		if (len & 1)
			reg = mulmod(x2n[k], reg);
	return reg;
}

static void make_x2n(void)
{
	uint32_t p = 1u << 30;	/* x^1 */

	x2n[0] = p;
	for (int k = 1; k < 64; k++)
		x2n[k] = p = mulmod(p, p);
}

uint32_t sbi_crc32c_zeros(uint32_t crc, uint64_t len)
{
	return len ? ~zeros_reg(~crc, len) : crc;
}
