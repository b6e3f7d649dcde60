/* SPDX-License-Identifier: Apache-2.0 */
/*
 * os/file_sig.h: what stat(2) says of a watched file, to notice that it changed. Certificate files
 * are replaced by cert-manager and SPIRE by swapping a symlink, so the path is stat'ed (symlinks
 * followed), never an open fd: device, inode, size and modification time together. Pure; any
 * thread.
 */
#ifndef SC_FILE_SIG_H
#define SC_FILE_SIG_H

#include <stdbool.h>
#include <sys/types.h>
#include <time.h>

struct sc_file_sig {
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtime;
};

/* The signature of path now; all zero when it is missing, unreadable or path is NULL. */
void sc_file_sig_of(const char *path, struct sc_file_sig *sig);
bool sc_file_sig_eq(const struct sc_file_sig *a, const struct sc_file_sig *b);

#endif
