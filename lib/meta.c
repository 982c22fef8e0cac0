/* SPDX-License-Identifier: MIT */
/*
 * Memory for the library's own metadata (page tables of buffers, page
 * states of heaps). It comes from mmap, never malloc: the fault path may
 * need it, and a faulting thread could be stopped inside malloc. It is
 * backed lazily, so a terabyte buffer's page table costs only the entries
 * in use. Large tables are not inherited by fork()ed children, which
 * cannot use them; what the fork handler reads in the child (the heap
 * table, to close descriptors) is.
 */
#include "internal.h"

#include <sys/mman.h>

void *sbi_meta_alloc(size_t bytes, bool inherit)
{
	void *p;

	if (!bytes)
		bytes = 1;
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (!inherit)
		madvise(p, bytes, MADV_DONTFORK);
	return p;
}

void sbi_meta_free(void *p, size_t bytes)
{
	if (p)
		munmap(p, bytes ? bytes : 1);
}
