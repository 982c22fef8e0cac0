/* SPDX-License-Identifier: MIT */
/*
 * Matrix-vector and matrix-matrix products: rows are split over the
 * threads in blocks of a multiple of 4 rows. The variants group rows by 4
 * from the start of their block and compute each output as one chain of
 * fused multiply-adds over the columns, so the result of a row depends on
 * neither the split nor on whether it came from sbk_matvec or sbk_matmul.
 */
#include "internal.h"

/* Multiply-adds below which a product stays on the calling thread: waking
 * the pool costs about as much as 256K of them. */
#define SERIAL_MACS ((size_t)1 << 18)

struct mm_job {
	const struct sbki_ops *ops;
	float *out;
	const float *w, *x;
	int n, rows, cols, rb;
};

static void mv_item(void *ctx, int i)
{
	const struct mm_job *j = ctx;
	int r0 = i * j->rb;
	int r1 = r0 + j->rb < j->rows ? r0 + j->rb : j->rows;

	j->ops->matvec(j->out + r0, j->w + (size_t)r0 * j->cols, j->x, r1 - r0,
		       j->cols);
}

static void mm_item(void *ctx, int i)
{
	const struct mm_job *j = ctx;
	int r0 = i * j->rb;
	int r1 = r0 + j->rb < j->rows ? r0 + j->rb : j->rows;

	j->ops->matmul(j->out + r0, (size_t)j->rows,
		       j->w + (size_t)r0 * j->cols, j->x, j->n, r1 - r0,
		       j->cols);
}

/* Rows per item: about 4 items per thread for balance, a multiple of 4,
 * at least 16. 0 means one item. */
static int row_block(int rows, size_t macs)
{
	int nt = macs < SERIAL_MACS ? 1 : sbk_get_threads(), rb;

	if (nt == 1)
		return 0;
	rb = (rows + 4 * nt - 1) / (4 * nt);
	rb = (rb + 3) & ~3;
	return rb < 16 ? 16 : rb;
}

SBK_API void sbk_matvec(float *out, const float *w, const float *x, int rows,
			int cols)
{
	struct mm_job j = {sbki_ops(), out, w, x, 1, rows, cols, 0};

	if (rows <= 0)
		return;
	if (cols <= 0) {
		memset(out, 0, (size_t)rows * sizeof(*out));
		return;
	}
	j.rb = row_block(rows, (size_t)rows * cols);
	if (!j.rb || j.rb >= rows)
		j.ops->matvec(out, w, x, rows, cols);
	else
		sbki_parallel((rows + j.rb - 1) / j.rb, mv_item, &j);
}

SBK_API void sbk_matmul(float *out, const float *w, const float *x, int n,
			int rows, int cols)
{
	struct mm_job j = {sbki_ops(), out, w, x, n, rows, cols, 0};

	if (rows <= 0 || n <= 0)
		return;
	if (cols <= 0) {
		memset(out, 0, (size_t)n * rows * sizeof(*out));
		return;
	}
	j.rb = row_block(rows, (size_t)rows * cols * n);
	if (!j.rb || j.rb >= rows)
		j.ops->matmul(out, (size_t)rows, w, x, n, rows, cols);
	else
		sbki_parallel((rows + j.rb - 1) / j.rb, mm_item, &j);
}
