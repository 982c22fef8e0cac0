/* The lock checker itself (make lockcheck, lib/lockcheck.c): a lock taken
 * out of order and a function called without the lock it needs abort the
 * process, naming the locks; the library's own paths pass (the whole
 * suite runs under it in CI). Skips in builds without the checks. */
#include "harness.h"
#include "internal.h"

#ifdef SBI_LOCK_DEBUG
static int child(const char *name)
{
	struct sb_pool *p = make_pool(64 * KiB, 4 * MiB, 0);
	struct sb_buf *b = make_buf(p, MiB, 0), *c = make_buf(p, MiB, 0);

	if (!strcmp(name, "order")) {
		/* pool->lock is inner to every buffer lock. */
		pthread_mutex_lock(&p->lock);
		pthread_mutex_lock(&b->lock);
		return 3;	/* not caught */
	}
	if (!strcmp(name, "bufs")) {
		/* Two buffer locks: lower id first, never the other way. */
		pthread_mutex_lock(&c->lock);
		pthread_mutex_lock(&b->lock);
		return 3;
	}
	if (!strcmp(name, "held")) {
		sbi_ready_want(p, 0, 0);	/* needs pool->lock */
		return 3;
	}
	if (!strcmp(name, "fine")) {
		pthread_mutex_lock(&b->lock);
		pthread_mutex_lock(&c->lock);	/* b's id < c's */
		pthread_mutex_lock(&p->lock);
		pthread_mutex_unlock(&p->lock);
		pthread_mutex_unlock(&c->lock);
		pthread_mutex_unlock(&b->lock);
		return 0;
	}
	return 2;
}

static int main_test(void)
{
	static const char *const bad[] = {"order", "bufs", "held"};
	char out[4096];

	require_uffd();
	for (size_t i = 0; i < 3; i++) {
		int st = run_child_env(bad[i], NULL, 30, out, sizeof(out));

		if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT) ||
		    !strstr(out, "sparsebuf lock check"))
			FAIL("%s: not caught (status %d): %s", bad[i], st, out);
		out[strcspn(out, "\n")] = 0;
		printf("%s: caught: %.200s\n", bad[i], out);
	}
	CHECK_EQ(child_exit_code(run_child_env("fine", NULL, 30, NULL, 0)), 0);
	printf("ok\n");
	return 0;
}
#else
static int child(const char *name)
{
	(void)name;
	return 2;
}

static int main_test(void)
{
	SKIP("built without the lock checks (make lockcheck runs this)");
}
#endif
