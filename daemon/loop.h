/* SPDX-License-Identifier: MIT */
/* sparsebufd's event loop (loop.c): descriptors, one periodic timer. */
#ifndef SBD_LOOP_H
#define SBD_LOOP_H

#include <stdint.h>

struct sbd_loop;
typedef void (*sbd_io_fn)(struct sbd_loop *loop, int fd, void *arg);
typedef void (*sbd_tick_fn)(struct sbd_loop *loop, void *arg);

struct sbd_loop *sbd_loop_new(void);
void sbd_loop_free(struct sbd_loop *loop);
/* Call fn when fd is readable (or hung up). 0 or -errno. */
int sbd_loop_add(struct sbd_loop *loop, int fd, sbd_io_fn fn, void *arg);
/* Forget fd (before closing it). */
void sbd_loop_del(struct sbd_loop *loop, int fd);
/* Call fn every ms milliseconds (one timer per loop). */
void sbd_loop_every(struct sbd_loop *loop, unsigned ms, sbd_tick_fn fn,
		    void *arg);
/* Run until sbd_loop_stop. 0 or -errno. */
int sbd_loop_run(struct sbd_loop *loop);
/* One turn: the timer if due, else wait at most timeout_ms (-1: until
 * something happens, or the timer) and call the handlers of what is
 * ready. Their number (0: the timer ran, or nothing happened), or
 * -errno. */
int sbd_loop_once(struct sbd_loop *loop, int timeout_ms);
void sbd_loop_stop(struct sbd_loop *loop);
uint64_t sbd_now_ms(void);
/* Nonzero: the time sbd_now_ms says (tests run the daemon on their own
 * clock, tests/fuzz/fuzz_dmsg.c); 0: CLOCK_MONOTONIC. */
extern uint64_t sbd_fake_now_ms;

#endif
