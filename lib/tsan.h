/* SPDX-License-Identifier: MIT */
/*
 * ThreadSanitizer sees each mmap as a write by the calling thread to the
 * whole range. A page placed by the fault handler is then "written" by the
 * handler, and the faulting thread's access after the userfaultfd wake-up
 * (an ordering TSan cannot see) looks like a race. When the mapping thread
 * ignores writes, TSan resets the range instead: the new mapping starts
 * with no access history, which is what a newly placed page is.
 *
 * The ready thread reads one byte of each 4 KiB of a page it placed
 * (touch.c) while the owner may already write there: the value read
 * is thrown away, only the access matters, so those reads are ignored.
 */
#ifndef SPARSEBUF_TSAN_H
#define SPARSEBUF_TSAN_H

#if defined(__SANITIZE_THREAD__)
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
#define SBI_MAP_BEGIN() AnnotateIgnoreWritesBegin(__FILE__, __LINE__)
#define SBI_MAP_END() AnnotateIgnoreWritesEnd(__FILE__, __LINE__)
#define SBI_TOUCH_BEGIN() AnnotateIgnoreReadsBegin(__FILE__, __LINE__)
#define SBI_TOUCH_END() AnnotateIgnoreReadsEnd(__FILE__, __LINE__)
#else
#define SBI_MAP_BEGIN() ((void)0)
#define SBI_MAP_END() ((void)0)
#define SBI_TOUCH_BEGIN() ((void)0)
#define SBI_TOUCH_END() ((void)0)
#endif

#endif /* SPARSEBUF_TSAN_H */
