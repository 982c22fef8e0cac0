/* Running out of vm.max_map_count: placements that cannot merge (every
 * other 4 KiB page) eventually fail with -ENOMEM and a clear message, never
 * a crash; accounting stays exact and everything can be released. */
#include "harness.h"

static int child(const char *name)
{
	(void)name;
	return 2;
}

static int main_test(void)
{
	struct sb_features f;
	struct sb_pool *p;
	struct sb_buf *b;
	char *x;
	long placed = 0, r = 0;
	size_t page = 4 * KiB, i;

	require_uffd();
	sb_features_get(&f);
	if (f.max_map_count <= 0 || f.max_map_count > 300000)
		SKIP("vm.max_map_count=%ld: too large to exhaust in a test",
		     f.max_map_count);
	p = make_pool(page, 64 * MiB, 0);
	b = make_buf(p, (size_t)f.max_map_count * 4 * page, 0);
	x = sb_buf_addr(b);
	for (i = 0; i < (size_t)f.max_map_count * 2; i += 2) {
		r = sb_buf_map(b, i * page, page);
		if (r != 1)
			break;
		x[i * page] = (char)(i % 100 + 1);
		placed++;
	}
	printf("%ld separate placements, then %ld (%s); %ld mappings of %ld\n",
	       placed, r, strerror((int)-r), sb_features_get(&f) == 0 ? f.map_count : -1,
	       f.max_map_count);
	CHECK_EQ(r, -ENOMEM);
	CHECK(placed > f.max_map_count / 3);
	CHECK_EQ(stats(p).pages_used, placed);
	CHECK_EQ(sb_buf_placed(b, 0, sb_buf_length(b)), placed);
	for (size_t k = 0; k < i; k += 2)
		CHECK_EQ(x[k * page], (char)(k % 100 + 1));
	/* Releasing merges the anonymous ranges back: it always works. */
	CHECK_EQ(sb_buf_unmap(b, 0, sb_buf_length(b)), placed);
	CHECK_EQ(stats(p).pages_used, 0);
	CHECK(maps_in(x, sb_buf_length(b)) <= 2);
	VERIFY(p);
	/* And placing works again. */
	CHECK_EQ(sb_buf_map(b, 0, 64 * page), 64);
	sb_buf_destroy(b);
	sb_pool_destroy(p);
	return 0;
}
