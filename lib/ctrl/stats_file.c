/* SPDX-License-Identifier: BSD-3-Clause */
/* The stats file: the Prometheus text (stats.c) written every stats.interval_ms and on SIGUSR1. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <fcntl.h>
#include <inttypes.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "ctrl_priv.h"

/*
 * A new file in @p dirfd under an unpredictable name: ".BASE.XXXXXXXXXXXXXXXX"
 * (64 random bits), created with O_EXCL | O_NOFOLLOW so that nothing planted
 * there (a symlink, a file of another user) is ever opened.
 */
static int
open_temp(int dirfd, const char *base, char *name, size_t len)
{
	for (int tries = 0; tries < 16; tries++) {
		uint64_t r;

		if (getrandom(&r, sizeof(r), 0) != sizeof(r))
			return -EIO;
		snprintf(name, len, ".%.200s.%016" PRIx64, base, r);
		int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
				0644);

		if (fd >= 0 || errno != EEXIST)
			return fd >= 0 ? fd : -errno;
	}
	return -EEXIST;
}

/*
 * The stats file's directory. It is opened once and kept (config_set keeps
 * the file in it): a name looked up each time could be swapped for a
 * symlink to another directory between writes. Only once it has been
 * removed (a /run cleanup, an operator's rm) is @p dir opened again, and
 * then only as a directory of the same owner, not through a symlink.
 * @return the fd or -errno
 */
static int
stats_dir(struct kvp_node *n, const char *dir)
{
	bool again = n->stats_dfd >= 0;
	struct stat st;
	int fd;

	if (again && (fstat(n->stats_dfd, &st) < 0 || st.st_nlink > 0))
		return n->stats_dfd;
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (again ? O_NOFOLLOW : 0));
	if (fd < 0)
		return errno == ELOOP ? -ENOTDIR : -errno;
	if (fstat(fd, &st) < 0 || (again && st.st_uid != n->stats_duid)) {
		int rc = again && st.st_uid != n->stats_duid ? -EPERM : -errno;

		close(fd);
		return rc;
	}
	if (again) {
		KVP_LOG(NOTICE, core,
			"stats file: directory %s was removed; writing to the new one", dir);
		close(n->stats_dfd);
	}
	n->stats_dfd = fd;
	n->stats_duid = st.st_uid;
	return fd;
}

int
kvp_stats_write_file(struct kvp_node *n)
{
	const char *path = n->cfg.stats_file;
	char dir[sizeof(n->cfg.stats_file)], tmp[256];
	const char *base;
	size_t len, off = 0;
	int dfd, fd, rc = 0;

	if (path[0] == '\0')
		return -ENOENT;
	len = kvp_stats_prometheus(n, n->stats_buf, n->stats_len);
	/*
	 * Same directory, then rename: a collector never reads half a file, and
	 * rename() replaces whatever is at the name (a planted symlink
	 * included) without following it.
	 */
	base = strrchr(path, '/');
	base = base ? base + 1 : path;
	snprintf(dir, sizeof(dir), "%.*s", base - path > 1 ? (int)(base - path - 1) : 1, path);
	dfd = stats_dir(n, dir);
	if (dfd < 0) {
		rc = dfd;
		goto err;
	}
	fd = open_temp(dfd, base, tmp, sizeof(tmp));
	if (fd < 0) {
		rc = fd;
		goto err;
	}
	while (off < len) {
		ssize_t w = write(fd, n->stats_buf + off, len - off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			rc = w < 0 ? -errno : -EIO;
			close(fd);
			goto err_unlink;
		}
		off += (size_t)w;
	}
	/* World-readable as the textfile collector expects, whatever our umask. */
	rc = fchmod(fd, 0644) < 0 ? -errno : 0;
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	if (rc < 0)
		goto err_unlink;
	if (renameat(dfd, tmp, dfd, base) < 0) {
		rc = -errno;
		goto err_unlink;
	}
	n->stats_writes++;
	return 0;

err_unlink:
	unlinkat(dfd, tmp, 0);
err:
	n->stats_write_errors++;
	KVP_LOG_RL(WARNING, core, "stats file %s: %s", path, strerror(-rc));
	return rc;
}

/* The stats file, every stats.interval_ms (a runtime knob: read each pass). */
static void
stats_tick(struct kvp_node *n, uint64_t now)
{
	uint32_t ms = __atomic_load_n(&n->cfg.stats_interval_ms, __ATOMIC_RELAXED);

	if (!n->cfg.stats_file[0] || !ms || now < n->next_stats_ns)
		return;
	kvp_stats_write_file(n);
	n->next_stats_ns = now + (uint64_t)ms * 1000000;
}

void
stats_file_init(struct kvp_node *n)
{
	loop_every(n, &n->stats_timer, 0, stats_tick);
}
