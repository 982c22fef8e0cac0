/* Review of issue 10 defect 5's fix (sbi_alloc keeps trying while the
 * clock's candidates are busy): readahead is best effort, but its page
 * allocations now wait like the touched page's. A fault on a file-backed
 * buffer, with a free page for the touched page, reads that page at once;
 * then the readahead pages' allocations find the budget full and every
 * candidate in another buffer whose lock is held (a save or an eviction of
 * a large range holds it for seconds: simulated here by holding it), and
 * sleep-retry for as long as the lock is held, up to 10 s, with the file
 * buffer's lock held. The touched page's read has landed, but its
 * completion cannot take the lock to map it: the thread waits the whole
 * time. Before the change the readahead gave up at once.
 *
 * Control: the same touch without readahead (a page that is not
 * sequential) returns at once.
 */
#include "harness.h"
#include "internal.h"

#include <fcntl.h>

#define PAGE (64 * KiB)
#define HEAP (4 * MiB)
#define BUDGET 32	/* pages */
#define HOLD_S 3.0

static struct sb_buf *busy_buf;
static atomic_bool holding;

/* What sb_buf_save or sb_buf_evict of a large range does to the buffer:
 * hold its lock for a while (and touch none of its memory). */
static void *hold_lock(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&busy_buf->lock);
	atomic_store(&holding, true);
	usleep((useconds_t)(HOLD_S * 1e6));
	atomic_store(&holding, false);
	pthread_mutex_unlock(&busy_buf->lock);
	return NULL;
}

static double touch_while_busy(struct sb_buf *f, size_t page)
{
	pthread_t t;
	double t0, dt;

	pthread_create(&t, NULL, hold_lock, NULL);
	WAIT_FOR(atomic_load(&holding), 5);
	CHECK(atomic_load(&holding));
	t0 = now_s();
	CHECK_EQ(((volatile char *)sb_buf_addr(f))[page * PAGE],
		 (char)('a' + page));
	dt = now_s() - t0;
	pthread_join(t, NULL);
	return dt;
}

static int body(void)
{
	struct sb_pool *p = disk_pool(PAGE, HEAP, BUDGET * PAGE);
	struct sb_buf *f, *g;
	char path[512], page[PAGE];
	double ctl, dt;
	int fd, err = 0;

	snprintf(path, sizeof(path), "%s/weights.bin", disk_dir());
	fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
	CHECK(fd >= 0);
	for (int i = 0; i < 16; i++) {
		memset(page, 'a' + i, sizeof(page));
		CHECK_EQ(write(fd, page, sizeof(page)), (long)sizeof(page));
	}
	close(fd);
	/* The budget less one page in an evictable buffer. */
	busy_buf = make_buf(p, 64 * PAGE, SB_BUF_EVICTABLE);
	for (size_t i = 0; i < BUDGET - 1; i++)
		((volatile char *)sb_buf_addr(busy_buf))[i * PAGE] = 1;
	f = sb_buf_open_file(p, path, 0, 16 * PAGE, 0, &err);
	if (!f)
		FAIL("sb_buf_open_file: %s", strerror(-err));
	g = sb_buf_open_file(p, path, 0, 16 * PAGE, 0, &err);
	if (!g)
		FAIL("sb_buf_open_file: %s", strerror(-err));

	/* Control: page 5 first (not sequential: no readahead). */
	ctl = touch_while_busy(f, 5);
	printf("touch of page 5 (no readahead), another buffer busy: %.3f s\n",
	       ctl);
	CHECK(ctl < 1.0);
	CHECK(sb_buf_unmap(f, 5 * PAGE, PAGE) >= 0);

	/* Page 0 of a fresh view: sequential from the start, readahead of
	 * the next pages. */
	dt = touch_while_busy(g, 0);
	printf("touch of page 0 (readahead), another buffer busy: %.3f s\n",
	       dt);
	if (dt >= 1.0)
		FAIL("a touch whose page was free waited %.1f s for best-effort "
		     "readahead (the other buffer's lock was held %.0f s)",
		     dt, HOLD_S);
	return 0;
}

static int child(const char *name)
{
	if (!strcmp(name, "body"))
		return body();
	return 2;
}

static int main_test(void)
{
	return run_disk_body(60);
}
