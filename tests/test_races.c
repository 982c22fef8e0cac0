/* Every operation at once from several threads, on shared buffers: map,
 * unmap, share (with the copy-on-write faults it causes), touches that
 * fault, and buffers created and destroyed meanwhile. Afterwards the page
 * tables and the pool agree exactly, and releasing everything returns the
 * pool to zero. No hang (the runner's timeout would catch it). */
#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>

#define PAGE (64 * KiB)
#define NBUF 4
#define NPAGES 64

static struct sb_pool *pool;
static struct sb_buf *bufs[NBUF];
static atomic_int stop;
static _Atomic long ops;

static unsigned rnd(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return *s >> 8;
}

static void *worker(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg * 7919u + 1;

	while (!atomic_load(&stop)) {
		struct sb_buf *b = bufs[rnd(&seed) % NBUF];
		size_t off = (rnd(&seed) % NPAGES) * PAGE;
		size_t len = (1 + rnd(&seed) % 8) * PAGE;
		volatile char *x = sb_buf_addr(b);
		long r = 0;

		if (off + len > NPAGES * PAGE)
			len = NPAGES * PAGE - off;
		switch (rnd(&seed) % 6) {
		case 0:
			r = sb_buf_map(b, off, len);
			break;
		case 1:
			r = sb_buf_unmap(b, off, len);
			break;
		case 2: {
			struct sb_buf *src = bufs[rnd(&seed) % NBUF];
			size_t soff = (rnd(&seed) % NPAGES) * PAGE;

			if (soff + len > NPAGES * PAGE)
				soff = NPAGES * PAGE - len;
			r = sb_buf_share(b, off, src, soff, len);
			break;
		}
		default:
			/* Reads and writes: demand faults and copies (the
			 * threads race on the bytes on purpose: atomics). */
			for (size_t o = 0; o < len; o += 4096)
				__atomic_fetch_add(&x[off + o], 1,
						   __ATOMIC_RELAXED);
			break;
		}
		if (r < 0)
			FAIL("operation failed: %s", strerror((int)-r));
		atomic_fetch_add(&ops, 1);
	}
	return NULL;
}

/* Buffers that come and go while the others work. */
static void *churn(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		struct sb_buf *b = make_buf(pool, 16 * MiB, 0);

		((volatile char *)sb_buf_addr(b))[3 * PAGE] = 1;
		CHECK(sb_buf_map(b, 0, 2 * PAGE) >= 1);
		sb_buf_destroy(b);
		atomic_fetch_add(&ops, 1);
	}
	return NULL;
}

static int child(const char *name)
{
	(void)name;
	return 2;
}

static int main_test(void)
{
	enum { NW = 4 };
	pthread_t th[NW + 1];
	double t0, secs = 3.0;
	long placed = 0;
	struct sb_stats st;

	require_cow();
	pool = make_pool(PAGE, 1 * MiB, 0);
	for (int i = 0; i < NBUF; i++)
		bufs[i] = make_buf(pool, NPAGES * PAGE, 0);
	for (int i = 0; i < NW; i++)
		pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i);
	pthread_create(&th[NW], NULL, churn, NULL);
	t0 = now_s();
	while (now_s() - t0 < secs)
		usleep(10000);
	atomic_store(&stop, 1);
	for (int i = 0; i <= NW; i++)
		pthread_join(th[i], NULL);

	/* Every buffer page holds one reference; shared pages count once. */
	for (int i = 0; i < NBUF; i++)
		placed += sb_buf_placed(bufs[i], 0, NPAGES * PAGE);
	st = stats(pool);
	printf("%ld operations in %.0f s: %zu pages in use for %ld placed "
	       "buffer pages, %llu faults, %llu copies\n",
	       atomic_load(&ops), secs, st.pages_used, placed,
	       (unsigned long long)st.faults,
	       (unsigned long long)st.cow_copies);
	CHECK(st.pages_used <= (size_t)placed);
	VERIFY(pool);
	CHECK(st.cow_copies > 0);
	for (int i = 0; i < NBUF; i++) {
		CHECK(sb_buf_unmap(bufs[i], 0, NPAGES * PAGE) >= 0);
		CHECK_EQ(sb_buf_placed(bufs[i], 0, NPAGES * PAGE), 0);
	}
	CHECK_EQ(stats(pool).pages_used, 0);
	VERIFY(pool);
	for (int i = 0; i < NBUF; i++)
		sb_buf_destroy(bufs[i]);
	CHECK(sb_pool_trim(pool) >= 0);
	st = stats(pool);
	CHECK_EQ(st.bytes_resident, 0);
	CHECK_EQ(st.heaps, 0);
	sb_pool_destroy(pool);
	return 0;
}
