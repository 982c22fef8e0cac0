/* SPDX-License-Identifier: MIT */
/*
 * CRC-32C (Castagnoli), the checksum of every page the disk tier writes
 * and reads back: SSE4.2's crc32 instruction where the CPU has it, else a
 * table, one byte at a time. The instruction takes 3 cycles and starts one
 * a cycle, so one chain of it uses a third of what it can do (a 256 KiB
 * page in ~30 us): buffers of 12 KiB or more go as three chains over
 * thirds of the buffer, joined at the end (crc_3way), for about a third
 * of the time.
 */
#include "internal.h"

#include <pthread.h>
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

static void zeros_op(uint32_t *op, uint64_t len);
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec);

/* The operator for len zero bytes, for the last few lengths asked (a
 * pool's page size, mostly): 30 us to make, 50 ns to use. */
#define OPS 4
static struct {
	size_t len;
	uint32_t op[32];
} ops[OPS];
static unsigned ops_next;
static pthread_mutex_t ops_lock = PTHREAD_MUTEX_INITIALIZER;

static void op_for(size_t len, uint32_t *op)
{
	pthread_mutex_lock(&ops_lock);
	for (unsigned k = 0; k < OPS; k++)
		if (ops[k].len == len) {
			memcpy(op, ops[k].op, sizeof(ops[k].op));
			pthread_mutex_unlock(&ops_lock);
			return;
		}
	pthread_mutex_unlock(&ops_lock);
	zeros_op(op, len);
	pthread_mutex_lock(&ops_lock);
	ops[ops_next].len = len;
	memcpy(ops[ops_next].op, op, sizeof(ops[0].op));
	ops_next = (ops_next + 1) % OPS;
	pthread_mutex_unlock(&ops_lock);
}

/*
 * Three chains over the thirds A, B, C of the buffer: A from the register
 * given, B and C from 0. The register is linear in what it has seen, so
 * the register after A then B is A's run on through len(B) zero bytes
 * (an operator, op_for), plus B's: reg(AB) = Z(reg A) ^ reg B, and the
 * same again for C.
 */
__attribute__((target("sse4.2"))) static uint32_t
crc_3way(uint32_t crc, const uint8_t *p, size_t len)
{
	size_t third = len / 3 / 8 * 8;
	const uint8_t *pb = p + third, *pc = p + 2 * third;
	uint64_t a = crc, b = 0, c = 0;
	uint32_t op[32], reg;

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
	op_for(third, op);
	reg = gf2_times(op, (uint32_t)a) ^ (uint32_t)b;
	reg = gf2_times(op, reg) ^ (uint32_t)c;
	return crc_sse42(reg, p + 3 * third, len - 3 * third);
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

static void gf2_mul(uint32_t *out, const uint32_t *a, const uint32_t *b)
{
	uint32_t t[32];

	for (int n = 0; n < 32; n++)
		t[n] = gf2_times(a, b[n]);	/* a after b */
	memcpy(out, t, sizeof(t));
}

/* The operator (a matrix, column n the image of bit n) that runs the
 * register on through len zero bytes. */
static void zeros_op(uint32_t *op, uint64_t len)
{
	uint32_t base[32];

	/* One zero bit (shift right, reduce by the polynomial), squared
	 * three times: one zero byte. */
	base[0] = 0x82f63b78u;
	for (int n = 1; n < 32; n++)
		base[n] = 1u << (n - 1);
	for (int k = 0; k < 3; k++)
		gf2_mul(base, base, base);
	for (int n = 0; n < 32; n++)
		op[n] = 1u << n;	/* none: the identity */
	for (; len; len >>= 1) {
		if (len & 1)
			gf2_mul(op, base, op);
		if (len > 1)
			gf2_mul(base, base, base);
	}
}

uint32_t sbi_crc32c_zeros(uint32_t crc, uint64_t len)
{
	uint32_t op[32];

	if (!len)
		return crc;
	zeros_op(op, len);
	return ~gf2_times(op, ~crc);
}
