/* SPDX-License-Identifier: MIT */
/*
 * CRC-32C: the fast path (three chains of the crc32 instruction joined at
 * the end, from 12 KiB) gives the table's checksum at every length around
 * its edges (where a third is not a multiple of 8, and the tail), at any
 * alignment, chained through sbi_crc32c_update, for many lengths in turn
 * and from several threads at once; and zero bytes skipped
 * (sbi_crc32c_zeros) equal zero bytes read, a terabyte of them the same in
 * one go or two. A known value anchors the table itself.
 */
#include "harness.h"
#include "harness_internal.h"

#define MAX (600 * KiB)

static uint8_t *data;

static void check_len(size_t off, size_t len)
{
	uint32_t fast = sbi_crc32c(data + off, len);
	uint32_t slow = sbi_crc32c_sw(data + off, len);

	if (fast != slow)
		FAIL("length %zu at offset %zu: %08x, the table says %08x", len,
		     off, fast, slow);
}

static void *hammer(void *arg)
{
	size_t seed = (size_t)arg;

	/* More lengths than the operator cache holds, in turn. */
	for (int i = 0; i < (UNDER_TSAN ? 40 : 200); i++) {
		size_t len = 12 * KiB + ((seed * 7919 + (size_t)i * 104729) %
					 (200 * KiB));

		check_len(i % 13, len);
	}
	return NULL;
}

static int child(const char *name)
{
	(void)name;
	return 1;	/* none */
}

static int main_test(void)
{
	static const size_t lens[] = {
		0, 1, 7, 8, 9, 63, 4095, 4096, 12 * KiB - 1, 12 * KiB,
		12 * KiB + 1, 12 * KiB + 7, 12 * KiB + 8, 12 * KiB + 23,
		64 * KiB, 64 * KiB + 3, 256 * KiB, 256 * KiB + 17,
		512 * KiB - 5, MAX - 64};
	uint8_t zeros[40000] = {0};
	pthread_t t[4];

	data = malloc(MAX);
	CHECK(data);
	for (size_t i = 0; i < MAX; i++)
		data[i] = (uint8_t)(i * 2654435761u >> 13);
	/* The standard check value: "123456789" -> e3069283. */
	CHECK_EQ(sbi_crc32c_sw("123456789", 9), 0xe3069283u);
	CHECK_EQ(sbi_crc32c("123456789", 9), 0xe3069283u);
	for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++)
		for (size_t off = 0; off < 9; off++)
			check_len(off, lens[k] - (off && lens[k] ? 1 : 0));
	for (size_t len = 12 * KiB - 40; len < 12 * KiB + 80; len++)
		check_len(3, len);
	/* Chained: the same as at once. */
	{
		uint32_t c = sbi_crc32c(data, 100 * KiB);

		c = sbi_crc32c_update(c, data + 100 * KiB, 13);
		c = sbi_crc32c_update(c, data + 100 * KiB + 13, 300 * KiB);
		CHECK_EQ(c, sbi_crc32c_sw(data, 400 * KiB + 13));
	}
	/* Zero bytes skipped. */
	for (size_t len = 0; len < sizeof(zeros); len += 1237)
		CHECK_EQ(sbi_crc32c_zeros(0, len), sbi_crc32c(zeros, len));
	CHECK_EQ(sbi_crc32c_zeros(sbi_crc32c(data, 5000), 30000),
		 sbi_crc32c_update(sbi_crc32c(data, 5000), zeros, 30000));
	/* A terabyte of holes, in one go or in two. */
	CHECK_EQ(sbi_crc32c_zeros(0x1234567u, TiB + 3 * GiB + 5),
		 sbi_crc32c_zeros(sbi_crc32c_zeros(0x1234567u, TiB), 3 * GiB + 5));
	for (size_t i = 0; i < 4; i++)
		CHECK(pthread_create(&t[i], NULL, hammer, (void *)(i + 1)) == 0);
	for (size_t i = 0; i < 4; i++)
		CHECK(pthread_join(t[i], NULL) == 0);
	free(data);
	printf("PASS: CRC-32C fast path equals the table at every edge\n");
	return 0;
}
