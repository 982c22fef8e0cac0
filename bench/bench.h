/* SPDX-License-Identifier: MIT */
/* Helpers shared by the benchmarks: clocks, a spin of "unrelated
 * computation", and a result table with ratios and targets. */
#ifndef SPARSEBUF_BENCH_H
#define SPARSEBUF_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double bench_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* About us microseconds of arithmetic that touches no memory: the rest of
 * a decode step, which gives background work room to run. */
static volatile double bench_sink;
static inline void bench_compute(double us)
{
	double t0 = bench_now_us(), x = 1.0;

	while (bench_now_us() - t0 < us)
		for (int i = 0; i < 64; i++)
			x = x * 1.0000001 + 1e-9;
	bench_sink = x;
}

static inline int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static inline double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The process's RSS and PSS (KiB), from one read of smaps_rollup: RSS
 * counts a page once per mapping that shows it, PSS divides shared pages
 * between their holders. The kernel counts huge pages (hugetlbfs: heaps
 * of SB_POOL_HUGETLB pools) in neither: they are added to both, once per
 * mapping that shows them, as RSS counts pages (PSS then counts a huge
 * page mapped twice twice: never less than the truth). */
static inline void bench_rollup_kib(long *rss, long *pss)
{
	char line[256];
	long v, huge = 0;
	FILE *f = fopen("/proc/self/smaps_rollup", "r");

	*rss = *pss = -1;
	while (f && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "Rss: %ld", &v) == 1)
			*rss = v;
		else if (sscanf(line, "Pss: %ld", &v) == 1)
			*pss = v;
		else if (sscanf(line, "Shared_Hugetlb: %ld", &v) == 1 ||
			 sscanf(line, "Private_Hugetlb: %ld", &v) == 1)
			huge += v;
	}
	if (f)
		fclose(f);
	if (*rss >= 0)
		*rss += huge;
	if (*pss >= 0)
		*pss += huge;
}


#endif /* SPARSEBUF_BENCH_H */
