/* NUMA on two nodes (issue 13): this machine has one node, so boot a small
 * VM with two (qemu, -numa node x2), a Debian kernel and an initramfs
 * holding one static program (tests/numa2/guest.c) as /init; it binds a
 * pool to node 1 and one to node 0 and asks move_pages(2) where their
 * pages are. Skips, saying why, where qemu, a kernel image or the static
 * guest is missing (make test installs qemu-system-x86 and
 * linux-image-amd64 on Debian when run as root). */
#include "harness.h"

#include <dirent.h>
#include <libgen.h>
#include <limits.h>

static int child(const char *name)
{
	(void)name;
	return 2;
}

/* ---- a newc cpio archive (the initramfs), written by hand ---------------- */

static void cpio_entry(FILE *f, const char *name, unsigned mode,
		       const void *data, size_t len)
{
	static unsigned ino = 1;
	size_t namesz = strlen(name) + 1, hdr;

	fprintf(f, "070701%08X%08X%08X%08X%08X%08X%08zX%08X%08X%08X%08X%08zX%08X",
		ino++, mode, 0u, 0u, 1u, 0u, len, 0u, 0u, 0u, 0u, namesz, 0u);
	fwrite(name, 1, namesz, f);
	hdr = 110 + namesz;
	for (; hdr % 4; hdr++)
		fputc(0, f);
	if (len)
		fwrite(data, 1, len, f);
	for (; len % 4; len++)
		fputc(0, f);
}

static void make_initramfs(const char *guest, const char *out)
{
	FILE *in = fopen(guest, "rb"), *f = fopen(out, "wb");
	static char buf[64 << 20];
	size_t n;

	if (!in || !f)
		FAIL("open %s or %s: %s", guest, out, strerror(errno));
	n = fread(buf, 1, sizeof(buf), in);
	CHECK(n > 0 && n < sizeof(buf));
	fclose(in);
	cpio_entry(f, "proc", 040755, NULL, 0);
	cpio_entry(f, "sys", 040755, NULL, 0);
	cpio_entry(f, "dev", 040755, NULL, 0);
	cpio_entry(f, "tmp", 041777, NULL, 0);
	cpio_entry(f, "init", 0100755, buf, n);
	cpio_entry(f, "TRAILER!!!", 0, NULL, 0);
	fclose(f);
}

/* The newest /boot/vmlinuz-*, or $SPARSEBUF_VMLINUZ. */
static bool find_kernel(char *out, size_t len)
{
	const char *env = getenv("SPARSEBUF_VMLINUZ");
	struct dirent *e;
	DIR *d;

	if (env && *env) {
		snprintf(out, len, "%s", env);
		return access(out, R_OK) == 0;
	}
	d = opendir("/boot");
	out[0] = 0;
	while (d && (e = readdir(d)))
		if (!strncmp(e->d_name, "vmlinuz-", 8) &&
		    strlen(e->d_name) + 7 < len &&
		    (!out[0] || strcmp(e->d_name, out + 6) > 0))
			snprintf(out, len, "/boot/%s", e->d_name);
	if (d)
		closedir(d);
	return out[0] && access(out, R_OK) == 0;
}

static int main_test(void)
{
	char self[PATH_MAX], guest[PATH_MAX + 32], kernel[PATH_MAX];
	char initrd[] = "/tmp/sbnuma2-XXXXXX", cmd[3 * PATH_MAX], line[512];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	bool kvm, pass = false;
	FILE *p;
	int fd;

	CHECK(n > 0);
	self[n] = 0;
	snprintf(guest, sizeof(guest), "%s/numa2-guest", dirname(self));
	if (access(guest, X_OK))
		SKIP("no static guest %s (not built in sanitizer builds)", guest);
	if (system("command -v qemu-system-x86_64 >/dev/null 2>&1"))
		SKIP("qemu-system-x86_64 is not installed (Debian: apt-get "
		     "install qemu-system-x86)");
	if (!find_kernel(kernel, sizeof(kernel)))
		SKIP("no kernel image in /boot (Debian: apt-get install "
		     "linux-image-amd64) and SPARSEBUF_VMLINUZ unset");
	fd = mkstemp(initrd);
	CHECK(fd >= 0);
	close(fd);
	make_initramfs(guest, initrd);
	/* TCG: KVM inside a VM (as on the machines this runs on) may fail
	 * to start or hang; the emulated guest boots in seconds. */
	kvm = false;
	/* Two nodes of 384 MiB, a CPU each; the console on stdio. */
	snprintf(cmd, sizeof(cmd),
		 "timeout 240 qemu-system-x86_64 %s -m 768 -smp 2 "
		 "-nographic -no-reboot -kernel '%s' -initrd '%s' "
		 "-append 'console=ttyS0 panic=-1 quiet' "
		 "-object memory-backend-ram,id=m0,size=384M "
		 "-object memory-backend-ram,id=m1,size=384M "
		 "-numa node,nodeid=0,cpus=0,memdev=m0 "
		 "-numa node,nodeid=1,cpus=1,memdev=m1 2>&1",
		 kvm ? "-enable-kvm -cpu host" : "-cpu max", kernel, initrd);
	printf("booting %s with two NUMA nodes (%s)\n", kernel,
	       kvm ? "KVM" : "TCG");
	fflush(stdout);
	p = popen(cmd, "r");
	CHECK(p != NULL);
	while (fgets(line, sizeof(line), p)) {
		if (strstr(line, "NUMA2 RESULT")) {
			printf("guest: %s", line);
			pass = strstr(line, "pass=1") != NULL;
		}
	}
	pclose(p);
	unlink(initrd);
	if (!pass)
		FAIL("the guest did not report its pages on the nodes it "
		     "bound them to");
	printf("ok\n");
	return 0;
}
