/* SPDX-License-Identifier: MIT */
/*
 * A main() for the harnesses without libFuzzer: run LLVMFuzzerTestOneInput
 * once on every file named (directories: every file in them). The
 * harnesses then build with any compiler (make fuzz-replay uses $(CC)) and
 * serve as plain regression tests of their corpus. Exit 0 when every input
 * ran; a broken invariant aborts, as under the fuzzer. Of libFuzzer's
 * flags only -runs=N is understood (each file N times: some reproducers
 * are races); the others are ignored, so run.sh drives both alike.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

/* The harnesses without setup do not define it. */
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static long reps = 1;

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *data = NULL;
	long size;

	if (!f) {
		perror(path);
		return -1;
	}
	if (fseek(f, 0, SEEK_END) < 0 || (size = ftell(f)) < 0 ||
	    fseek(f, 0, SEEK_SET) < 0) {
		perror(path);
		fclose(f);
		return -1;
	}
	/* A copy of exactly size bytes, as libFuzzer gives: ASan sees any
	 * read past the input. */
	data = malloc(size ? (size_t)size : 1);
	if (!data || fread(data, 1, (size_t)size, f) != (size_t)size) {
		perror(path);
		free(data);
		fclose(f);
		return -1;
	}
	fclose(f);
	for (long i = 0; i < reps; i++)
		LLVMFuzzerTestOneInput(data, (size_t)size);
	free(data);
	return 0;
}

static int run_path(const char *path, int *n)
{
	struct dirent **names;
	struct stat st;
	int k, r = 0;

	if (stat(path, &st) < 0) {
		perror(path);
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		(*n)++;
		return run_file(path);
	}
	/* Sorted: the same order on every run. */
	k = scandir(path, &names, NULL, alphasort);
	if (k < 0) {
		perror(path);
		return -1;
	}
	for (int i = 0; i < k; i++) {
		char sub[4096];

		if (names[i]->d_name[0] != '.') {
			snprintf(sub, sizeof(sub), "%s/%s", path,
				 names[i]->d_name);
			if (run_path(sub, n) < 0)
				r = -1;
		}
		free(names[i]);
	}
	free(names);
	return r;
}

int main(int argc, char **argv)
{
	int n = 0, r = 0;

	if (LLVMFuzzerInitialize)
		LLVMFuzzerInitialize(&argc, &argv);
	for (int i = 1; i < argc; i++)
		if (!strncmp(argv[i], "-runs=", 6) && atol(argv[i] + 6) > 0)
			reps = atol(argv[i] + 6);
	for (int i = 1; i < argc; i++)
		if (argv[i][0] != '-' && run_path(argv[i], &n) < 0)
			r = 1;
	printf("replayed %d inputs\n", n);
	return r;
}
