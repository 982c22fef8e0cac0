/* SPDX-License-Identifier: MIT */
/*
 * Structs that grow (sparsebuf.h): a caller's struct meets the library's
 * own by size, as openat2(2) and clone3(2) take theirs. What both know is
 * copied; what only the library knows is 0 (the default) coming in and
 * is not written going out; what only the caller knows must be 0 coming
 * in (else -E2BIG: it asked for something this library cannot do) and is
 * zeroed going out. And the version.
 */
#include "internal.h"

#include <errno.h>
#include <string.h>

int sbi_struct_in(void *ours, size_t known, const void *theirs, size_t size,
		  size_t min)
{
	const unsigned char *t = theirs;

	if (size < min)
		return -EINVAL;
	for (size_t i = known; i < size; i++)
		if (t[i])
			return -E2BIG;
	memset(ours, 0, known);
	memcpy(ours, theirs, size < known ? size : known);
	return 0;
}

int sbi_struct_out(void *theirs, size_t size, const void *ours, size_t known,
		   size_t min)
{
	if (size < min)
		return -EINVAL;
	memcpy(theirs, ours, size < known ? size : known);
	if (size > known)
		memset((char *)theirs + known, 0, size - known);
	return 0;
}

SB_API const char *sb_version(void)
{
	return SPARSEBUF_VERSION_STRING;
}

SB_API int sb_version_number(void)
{
	return SPARSEBUF_VERSION_MAJOR * 10000 + SPARSEBUF_VERSION_MINOR * 100 +
	       SPARSEBUF_VERSION_PATCH;
}
