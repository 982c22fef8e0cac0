/* sb_buf_open_file on a block device (issue 10, defect 4): its pages read
 * the device's bytes, not zeros (fstat says 0 bytes for a block device;
 * the size comes from BLKGETSIZE64), bytes past its end read as zeros, and
 * a write raises SIGSEGV as for a file. The device is a loop device over
 * a file in $SBT_DIR, attached with the loop ioctls; skipped (with the
 * reason) where there are none or they are not allowed. Runs with both
 * pagers. */
#include "harness.h"

#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>

#define PAGE (64 * KiB)
#define HEAP (4 * MiB)
#define DEV_BYTES (1 * MiB + 4096)	/* not a whole number of pages */

static int loop_fd = -1;

static void detach(void)
{
	if (loop_fd >= 0) {
		ioctl(loop_fd, LOOP_CLR_FD, 0);
		close(loop_fd);
		loop_fd = -1;
	}
}

/* Attach a loop device to the file at backing; its path goes to dev. */
static int attach(const char *backing, char *dev, size_t len)
{
	int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC), n, fd;

	if (ctl < 0)
		return -errno;
	for (int tries = 0; tries < 8; tries++) {
		n = ioctl(ctl, LOOP_CTL_GET_FREE);
		if (n < 0) {
			close(ctl);
			return -errno;
		}
		snprintf(dev, len, "/dev/loop%d", n);
		loop_fd = open(dev, O_RDWR | O_CLOEXEC);
		if (loop_fd < 0) {
			close(ctl);
			return -errno;
		}
		fd = open(backing, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			FAIL("open %s: %s", backing, strerror(errno));
		if (ioctl(loop_fd, LOOP_SET_FD, fd) == 0) {
			close(fd);
			close(ctl);
			atexit(detach);
			return 0;
		}
		close(fd);
		close(loop_fd);
		loop_fd = -1;
		if (errno != EBUSY)	/* taken meanwhile: another one */
			break;
	}
	close(ctl);
	return -errno;
}

static int body(void)
{
	char backing[512], dev[64];
	char *data = malloc(DEV_BYTES);
	struct sb_pool *p;
	struct sb_buf *b;
	const char *x;
	int fd, err = 0, r;

	CHECK(data != NULL);
	disk_fill(data, DEV_BYTES, 0x6c6f6f70);
	snprintf(backing, sizeof(backing), "%s/backing", disk_dir());
	fd = open(backing, O_CREAT | O_TRUNC | O_WRONLY, 0600);
	CHECK(fd >= 0);
	CHECK_EQ(write(fd, data, DEV_BYTES), DEV_BYTES);
	close(fd);
	r = attach(backing, dev, sizeof(dev));
	if (r < 0)
		SKIP("no loop device: %s", strerror(-r));

	p = disk_pool(PAGE, HEAP, 0);
	/* Two pages more than the device holds: the rest reads as zeros. */
	b = sb_buf_open_file(p, dev, 0, DEV_BYTES + 2 * PAGE, 0, &err);
	if (!b)
		FAIL("sb_buf_open_file(%s): %s", dev, strerror(-err));
	x = sb_buf_addr(b);
	if (memcmp(x, data, DEV_BYTES))
		FAIL("the device's bytes differ (zeros: %s)",
		     disk_check_zero(x, PAGE) < 0 ? "yes" : "no");
	CHECK_EQ(disk_check_zero(x + DEV_BYTES, sb_buf_length(b) - DEV_BYTES),
		 -1);
	printf("%s: %zu bytes read through the buffer, %llu pages in\n", dev,
	       DEV_BYTES, (unsigned long long)stats(p).pages_in);
	/* From an offset, as for a file. */
	sb_buf_destroy(b);
	b = sb_buf_open_file(p, dev, 4 * 4096, PAGE, 0, &err);
	CHECK(b != NULL);
	CHECK(memcmp(sb_buf_addr(b), data + 4 * 4096, PAGE) == 0);
	sb_buf_destroy(b);
	CHECK_EQ(stats(p).io_errors, 0);
	sb_pool_destroy(p);
	detach();
	free(data);
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
