/* SPDX-License-Identifier: MIT */
/*
 * Logging to stderr. Formats into a stack buffer and issues one write(2):
 * no stdio lock, no malloc, so the fault-handler thread may log even when a
 * faulting thread is stopped inside stdio.
 */
#include "internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

int sbi_log_level = SBI_LOG_WARN;

void sbi_log(int level, const char *fmt, ...)
{
	static const char *const names[] = {"", "error", "warning", "info",
					    "debug"};
	char line[512];
	va_list ap;
	int n, saved = errno;

	if (level > sbi_log_level)
		return;
	n = snprintf(line, sizeof(line), "sparsebuf: %s: ", names[level]);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, (size_t)n) < 0) {
		/* Nowhere left to report it. */
	}
	errno = saved;
}

uint64_t sbi_mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

bool sbi_log_gate(int level, _Atomic uint64_t *last_ms)
{
	uint64_t now, last;

	if (level > sbi_log_level)
		return false;
	now = sbi_mono_ms();
	last = atomic_load_explicit(last_ms, memory_order_relaxed);
	if (last && now - last < 1000)
		return false;
	/* One thread of those that race here says it. (0 means never
	 * said: a clock still at 0 counts as 1.) */
	return atomic_compare_exchange_strong(last_ms, &last, now ? now : 1);
}
