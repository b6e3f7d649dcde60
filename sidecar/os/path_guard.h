/* SPDX-License-Identifier: Apache-2.0 */
/*
 * os/path_guard.h: which host files a worker may register. A path is accepted only when it lies
 * beneath --shm-dir or a --register-dir, resolves without symlinks, magic links or "..", names a
 * regular file, and is none of the sidecar's own secrets (the --key-file). Pure functions of the
 * configuration and the file system: any thread may call them, no lock needed.
 */
#ifndef SC_PATH_GUARD_H
#define SC_PATH_GUARD_H

#include "conf/config.h"
#include "base/status.h"

/*
 * Open path read-write (O_CLOEXEC, O_NONBLOCK so a FIFO cannot block) for RegisterRegion.
 * Returns the fd, or -1 with err: PERMISSION_DENIED (outside the allowed directories, a symlink
 * or ".." on the way, the key file), NOT_FOUND (no such file), INVALID_ARGUMENT (not a regular
 * file). The message names the allowed directories.
 */
int sc_path_guard_open(const struct sc_config *cfg, const char *path, struct sc_err *err);

/*
 * The fallback for kernels without openat2 (ENOSYS), public so tests can run it anywhere: open rel
 * beneath dirfd read-write, one component at a time with O_NOFOLLOW, refusing "..". Returns the
 * fd, or -1 with errno (ELOOP: a symlink on the way; EXDEV: ".."; others as openat).
 */
int sc_path_guard_walk(int dirfd, const char *rel);

/* At start-up: every --register-dir must be an existing directory. */
int sc_path_guard_check_dirs(const struct sc_config *cfg, struct sc_err *err);

#endif
