/* SPDX-License-Identifier: Apache-2.0 */
/*
 * os/file_sig.c: a watched file's stat(2) signature (os/file_sig.h), used by the peer TLS and gRPC
 * certificate reloads. Pure; any thread.
 */
#include "os/file_sig.h"

#include <string.h>
#include <sys/stat.h>

void sc_file_sig_of(const char *path, struct sc_file_sig *sig)
{
	struct stat st;
	memset(sig, 0, sizeof(*sig));
	if (path && stat(path, &st) == 0) { /* the path: a swapped symlink counts as a change */
		sig->dev = st.st_dev;
		sig->ino = st.st_ino;
		sig->size = st.st_size;
		sig->mtime = st.st_mtim;
	}
}

bool sc_file_sig_eq(const struct sc_file_sig *a, const struct sc_file_sig *b)
{
	return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
	       a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}
