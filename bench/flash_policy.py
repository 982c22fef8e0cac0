#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Replay an sbflash trace through cache policies: MiB read per token.

    build/bin/sbflash MODEL --mode flash --steps 16 --trace T.bin
    bench/flash_policy.py T.bin --steps 16 --mib 160 170

The trace (sbflash --trace, split fetch) holds, per token and layer, the
predicted neurons (their up rows are read) and those that fire (their down
columns are read). Each half is one page (--page-kib, 8 for the 1 GiB and
4.5 GiB models of bench/flash.sh). A policy holds at most --mib of pages
and reads every page it does not hold when it is used:

  lru          least recently used over both halves: what the kernel's page
               cache does for mmap_sparse (active and inactive lists aside)
  downs-first  sbflash's: room is made in the layer about to read, down
               columns whose neuron fired longest ago first, then up rows,
               least recently used first (frequency ignored); like the
               runner it never releases what the current token uses, so
               with less room than one layer's pages it holds more than
               --mib and reads less than the bound
  opt          Belady's: the page used again furthest ahead goes (knows the
               future: the bound no policy can beat)
"""
import argparse
import collections
import heapq
import struct
import sys


def load(path, steps):
    """[(kind, token, layer, indices)] of the first `steps` tokens. A trace
    cut short (sbflash killed) keeps its whole records; anything else that
    is not a trace stops with a message."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        sys.exit("flash_policy: %s: %s" % (path, e.strerror))
    out, off = [], 0
    while off + 16 <= len(data):
        kind, tok, layer, n = struct.unpack_from("<4i", data, off)
        if kind not in (0, 1) or tok < 0 or layer < 0 or n < 0:
            sys.exit("flash_policy: %s: not an sbflash trace (bad record "
                     "at byte %d)" % (path, off))
        if off + 16 + 4 * n > len(data):
            print("flash_policy: %s: cut short at byte %d: the records "
                  "before it are used" % (path, off), file=sys.stderr)
            break
        idx = struct.unpack_from("<%di" % n, data, off + 16)
        off += 16 + 4 * n
        if tok < steps:
            out.append((kind, tok, layer, idx))
    return out


def accesses(events):
    """(token, page) in order; a page is (layer, neuron, half)."""
    for kind, tok, layer, idx in events:
        for i in idx:
            yield tok, (layer, i, kind)


def lru(events, cap):
    held, miss = collections.OrderedDict(), 0
    for _, page in accesses(events):
        if page in held:
            held.move_to_end(page)
            continue
        miss += 1
        held[page] = True
        if len(held) > cap:
            held.popitem(last=False)
    return miss


def downs_first(events, cap):
    last, miss = {}, 0
    for kind, tok, layer, idx in events:
        fresh = []
        for i in idx:
            page = (layer, i, kind)
            if page in last:
                last[page] = tok
            else:
                fresh.append(page)
        need = len(last) + len(fresh) - cap
        for half in (1, 0):	# down columns, then up rows
            if need <= 0:
                break
            old = sorted((t, p) for p, t in last.items()
                         if p[0] == layer and p[2] == half and t < tok)
            for _, p in old[:need]:
                del last[p]
            need -= min(need, len(old))
        for page in fresh:
            last[page] = tok
            miss += 1
    return miss


def opt(events, cap):
    seq = [page for _, page in accesses(events)]
    nxt, seen = [0] * len(seq), {}
    for j in range(len(seq) - 1, -1, -1):
        nxt[j] = seen.get(seq[j], len(seq))
        seen[seq[j]] = j
    held, heap, miss = {}, [], 0
    for j, page in enumerate(seq):
        if page not in held:
            miss += 1
            if len(held) >= cap:
                while True:
                    n, victim = heapq.heappop(heap)
                    if held.get(victim) == -n:
                        del held[victim]
                        break
        held[page] = nxt[j]
        heapq.heappush(heap, (-nxt[j], page))
    return miss


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--mib", type=float, nargs="+", default=[160.0])
    ap.add_argument("--page-kib", type=int, default=8)
    a = ap.parse_args()
    if a.steps < 1 or a.page_kib < 1 or not all(0 < m < 1 << 30
                                                 for m in a.mib):
        ap.error("--steps and --page-kib must be 1 or more, --mib in "
                 "(0, 2^30)")
    events = load(a.trace, a.steps)
    if not events:
        sys.exit("flash_policy: no records in %s" % a.trace)
    steps = max(e[1] for e in events) + 1
    per = a.page_kib / 1024.0 / steps   # MiB per token per page read
    print("%8s %8s %12s %8s" % ("MiB", "lru", "downs-first", "opt"))
    for mib in a.mib:
        cap = max(1, int(mib * 1024 / a.page_kib))
        print("%8.1f %8.2f %12.2f %8.2f" % (
            mib, lru(events, cap) * per, downs_first(events, cap) * per,
            opt(events, cap) * per))


if __name__ == "__main__":
    main()
