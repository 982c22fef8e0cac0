/* SPDX-License-Identifier: MIT */
/*
 * File-backed weights with prefetch: a weights file shown as a read-only
 * buffer whose pages are read in through io_uring when touched; before a
 * layer runs, sb_buf_prefetch asks for the rows it will read, in one
 * submission, so the read overlaps the work before it.
 *
 *   cc file_weights.c $(pkg-config --cflags --libs sparsebuf) -o file_weights
 *   ./file_weights [FILE]
 */
#include <sparsebuf.h>
#include <stdio.h>
#include <string.h>

enum { ROWS = 1024, COLS = 1024 };	/* 4 MiB of f32 weights */

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "weights.bin";
	static float row[COLS];
	struct sb_range want[8];
	struct sb_stats st;
	struct sb_buf *w;
	const float *m;
	double sum = 0;
	FILE *f;
	int err;

	/* A weights file: row r holds the value r. */
	f = fopen(path, "wb");
	if (!f)
		return 1;
	for (int r = 0; r < ROWS; r++) {
		for (int c = 0; c < COLS; c++)
			row[c] = (float)r;
		fwrite(row, sizeof(row), 1, f);
	}
	fclose(f);

	w = sb_buf_open_file(sb_default_pool(), path, 0, sizeof(row) * ROWS, 0,
			     &err);
	if (!w) {
		fprintf(stderr, "sb_buf_open_file %s: %s\n", path, strerror(-err));
		return 1;
	}
	m = sb_buf_addr(w);
	/* The rows a predictor picked: read ahead of use, in one go. */
	for (int i = 0; i < 8; i++)
		want[i] = (struct sb_range){(size_t)(i * 97) * sizeof(row),
					    sizeof(row)};
	sb_buf_prefetch(w, want, 8, SB_PREFETCH_WAIT);
	for (int i = 0; i < 8; i++)
		for (int c = 0; c < COLS; c++)
			sum += m[(size_t)(i * 97) * COLS + (size_t)c];
	sb_pool_stats(sb_default_pool(), &st);
	printf("file_weights: 8 of %d rows used, %llu KiB read of %zu KiB, "
	       "sum %.0f\n", ROWS, (unsigned long long)st.bytes_read >> 10,
	       sizeof(row) * ROWS >> 10, sum);
	sb_buf_destroy(w);
	remove(path);
	return sum == (double)COLS * 97 * 28 ? 0 : 1;
}
