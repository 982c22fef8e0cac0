/* SPDX-License-Identifier: MIT */
/*
 * USDT probes: `perf stat -e 'sdt_sparsebuf:*'` counts them once perf has
 * been told about the binary (`perf buildid-cache --add`), see
 * bench/perf-faults.sh. Each is a single nop until a tracer attaches.
 *
 *   sparsebuf:fault  (buf, addr, flags)  a fault message serviced
 *   sparsebuf:map    (buf, page index)   a page placed by sb_buf_map
 *   sparsebuf:unmap  (buf, page index)   a page released
 *   sparsebuf:cow    (buf, page index)   a copy-on-write copy
 *   sparsebuf:pagein (buf, page index)   a page read in from disk, placed
 *   sparsebuf:evict  (buf, page index)   a page written out (or dropped)
 *
 * Each probe has one site, so perf attaches one uprobe per name.
 */
#ifndef SPARSEBUF_TRACE_H
#define SPARSEBUF_TRACE_H

#if defined(__has_include)
#if __has_include(<sys/sdt.h>)
#include <sys/sdt.h>
#define SBI_HAVE_SDT 1
#endif
#endif

#ifdef SBI_HAVE_SDT
#define SBI_TRACE_FAULT(buf, addr, flags) \
	DTRACE_PROBE3(sparsebuf, fault, buf, addr, flags)
#define SBI_TRACE_MAP(buf, idx) DTRACE_PROBE2(sparsebuf, map, buf, idx)
#define SBI_TRACE_UNMAP(buf, idx) DTRACE_PROBE2(sparsebuf, unmap, buf, idx)
#define SBI_TRACE_COW(buf, idx) DTRACE_PROBE2(sparsebuf, cow, buf, idx)
#define SBI_TRACE_PAGEIN(buf, idx) DTRACE_PROBE2(sparsebuf, pagein, buf, idx)
#define SBI_TRACE_EVICT(buf, idx) DTRACE_PROBE2(sparsebuf, evict, buf, idx)
#else
#define SBI_TRACE_FAULT(buf, addr, flags) ((void)(buf), (void)(addr), (void)(flags))
#define SBI_TRACE_MAP(buf, idx) ((void)(buf), (void)(idx))
#define SBI_TRACE_UNMAP(buf, idx) ((void)(buf), (void)(idx))
#define SBI_TRACE_COW(buf, idx) ((void)(buf), (void)(idx))
#define SBI_TRACE_PAGEIN(buf, idx) ((void)(buf), (void)(idx))
#define SBI_TRACE_EVICT(buf, idx) ((void)(buf), (void)(idx))
#endif

#endif /* SPARSEBUF_TRACE_H */
