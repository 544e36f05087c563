/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The node's control plane: one epoll set on the main lcore for the client,
 * admin and peer sockets, plus the workers' outboxes. Everything sized here
 * comes from the configuration; nothing grows afterwards.
 */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_malloc.h>
#include <rte_mempool.h>
#include <rte_ring.h>

#include "ctrl_priv.h"

#define MSG_POOL_SIZE 4095
#define REAP_PERIOD_NS 10000000ull
/* EAL (~20 seen), stdio, epoll, eventfds, listeners and locks, io_uring, the spare fd, RDMA devices, CUDA. */
#define FD_RESERVE 128
#define FD_PER_CLIENT 3
/* glibc's default nr_open: setrlimit refuses more, and more is never needed. */
#define FD_SOFT_CAP (1ull << 20)

uint64_t
kvp_node_fd_need(const struct kvp_config *cfg, unsigned nworkers)
{
	uint64_t per_peer = 2ull * cfg->tcp_conns * (nworkers ? nworkers : 1) + 1;

	/* Every slot may hold a peer: those that join at run time need their files too. */
	return FD_RESERVE + (uint64_t)FD_PER_CLIENT * cfg->max_clients + per_peer * cfg->max_peers +
	       KVP_ADMIN_CONNS + KVP_PENDING_MAX;
}

int
kvp_node_fd_limit(const struct kvp_config *cfg, unsigned nworkers, bool raise, char *msg,
		  size_t msglen)
{
	uint64_t need = kvp_node_fd_need(cfg, nworkers), was;
	uint64_t per_peer = 2ull * cfg->tcp_conns * (nworkers ? nworkers : 1) + 1;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
		snprintf(msg, msglen, "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
		return -errno;
	}
	was = rl.rlim_cur;
	if (raise && rl.rlim_cur < rl.rlim_max) {
		struct rlimit up = rl;

		up.rlim_cur = rl.rlim_max > FD_SOFT_CAP ? FD_SOFT_CAP : rl.rlim_max;
		if (up.rlim_cur > rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &up) == 0)
			rl = up;
	}
	if ((uint64_t)rl.rlim_cur >= need) {
		if (rl.rlim_cur != was)
			snprintf(msg, msglen,
				 "open files: limit %" PRIu64 " (raised from %" PRIu64 "), this "
				 "configuration needs up to %" PRIu64,
				 (uint64_t)rl.rlim_cur, was, need);
		else
			snprintf(msg, msglen,
				 "open files: limit %" PRIu64 ", this configuration needs up to %" PRIu64,
				 (uint64_t)rl.rlim_cur, need);
		return 0;
	}
	uint64_t other = need - (uint64_t)FD_PER_CLIENT * cfg->max_clients;
	uint64_t fit = rl.rlim_cur > other ? ((uint64_t)rl.rlim_cur - other) / FD_PER_CLIENT : 0;

	snprintf(msg, msglen,
		 "limits.max_clients = %u with limits.max_peers = %u needs up to %" PRIu64 " open files (%d "
		 "per client, %u per peer, %u for the rest) but RLIMIT_NOFILE is %" PRIu64
		 " (hard limit %" PRIu64 "): raise the limit (ulimit -n, LimitNOFILE= in the "
		 "systemd unit) or lower limits.max_clients to %" PRIu64 " or less",
		 cfg->max_clients, cfg->max_peers, need, FD_PER_CLIENT, (unsigned)per_peer,
		 (unsigned)(other - per_peer * cfg->max_peers),
		 (uint64_t)rl.rlim_cur, (uint64_t)rl.rlim_max, fit);
	return -EMFILE;
}

/*
 * Create the socket's directory when it is missing (its last component
 * only: a missing parent is a configuration error): mode @p mode, group
 * @p grp when one is configured, so that the socket's own group can reach
 * it and nobody else can list it. An existing directory is left as it is.
 */
static int
sock_dir(const char *path, const struct kvp_group *grp, mode_t mode, char *err, size_t errlen)
{
	const char *slash = strrchr(path, '/');
	char dir[KVP_PATH_MAX];
	struct stat st;
	size_t n = slash ? (size_t)(slash - path) : 0;

	if (n == 0 || n >= sizeof(dir))
		return 0;
	memcpy(dir, path, n);
	dir[n] = '\0';
	if (stat(dir, &st) == 0) {
		if (S_ISDIR(st.st_mode))
			return 0;
		snprintf(err, errlen, "%s: the socket's directory %s is not a directory", path, dir);
		return -ENOTDIR;
	}
	if (errno != ENOENT || (mkdir(dir, mode) < 0 && errno != EEXIST) ||
	    (grp->name[0] && chown(dir, (uid_t)-1, (gid_t)grp->gid) < 0) || chmod(dir, mode) < 0) {
		int e = errno;

		snprintf(err, errlen, "%s: cannot create the socket directory %s: %s", path, dir,
			 strerror(e));
		return -e;
	}
	KVP_LOG(NOTICE, core, "created the socket directory %s (mode %04o%s%s)", dir,
		(unsigned)mode, grp->name[0] ? ", group " : "", grp->name);
	return 0;
}

/* Remove our socket's name, unless something else took its place. */
static void
unlink_socket(const char *path)
{
	struct stat st;

	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
}

/*
 * Bind a UNIX stream socket, guarded by "<path>.lock" so that a second
 * daemon configured with the same path fails instead of stealing it. The
 * file ends up mode 0660, owned by @p grp when one is configured.
 */
static int
unix_listen(const char *path, const struct kvp_group *grp, int *lock_fd, char *err,
	    size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char lock[KVP_PATH_MAX + 8], chgrp[96], proc[32];
	const char *step;
	struct stat st;
	int fd, lfd, pfd = -1, e;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "%s: socket path too long", path);
		return -ENAMETOOLONG;
	}
	snprintf(lock, sizeof(lock), "%s.lock", path);
	/* Never through a symlink, nor blocking on a FIFO put there. */
	lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
	if (lfd < 0) {
		e = errno;
		snprintf(err, errlen, "%s: %s", lock,
			 e == ELOOP ? "a symlink: refused" : strerror(e));
		return -e;
	}
	if (fstat(lfd, &st) < 0 || !S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s: not a regular file: refused", lock);
		close(lfd);
		return -EEXIST;
	}
	if (flock(lfd, LOCK_EX | LOCK_NB) < 0) {
		snprintf(err, errlen, "%s: in use by another kvproxyd", path);
		close(lfd);
		return -EADDRINUSE;
	}
	/* We hold the lock, so an existing socket is stale; anything else is not ours. */
	if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
		snprintf(err, errlen, "%s: exists and is not a socket: refusing to replace it",
			 path);
		close(lfd);
		return -EEXIST;
	}
	unlink(path);
	strcpy(sa.sun_path, path);
	step = "socket";
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		goto err_close_lock;
	/*
	 * bind() gives the file the socket's own mode: owner only until the
	 * group is right, so nobody else can connect in between.
	 */
	step = "bind";
	if (fchmod(fd, 0600) < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto err_close;
	/*
	 * Group and mode go to the inode bind() made, held by an O_PATH fd: the
	 * name could be swapped for a link to another file in between.
	 */
	step = "open after bind";
	pfd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (pfd < 0)
		goto err_unlink;
	errno = EEXIST;
	if (fstat(pfd, &st) < 0 || !S_ISSOCK(st.st_mode))
		goto err_unlink;
	snprintf(chgrp, sizeof(chgrp), "cannot give it group %s (gid %u)", grp->name, grp->gid);
	step = chgrp;
	if (grp->name[0] && fchownat(pfd, "", (uid_t)-1, (gid_t)grp->gid, AT_EMPTY_PATH) < 0)
		goto err_unlink;
	step = "chmod";
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", pfd);
	if (chmod(proc, 0660) < 0)
		goto err_unlink;
	close(pfd);
	pfd = -1;
	step = "listen";
	if (listen(fd, 64) < 0)
		goto err_unlink;
	*lock_fd = lfd;
	return fd;

err_unlink:
	e = errno; /* before the clean-up can change it */
	if (pfd >= 0)
		close(pfd);
	unlink_socket(path);
	close(fd);
	goto err_report;
err_close:
	e = errno;
	close(fd);
	goto err_report;
err_close_lock:
	e = errno;
err_report:
	snprintf(err, errlen, "%s: %s: %s", path, step, strerror(e));
	close(lfd);
	return -e;
}

/* Regions of departed clients are unmapped once their last transfer ends. */
static void
reap(struct kvp_node *n, uint64_t now)
{
	(void)now;
	kvp_region_reap(&n->regions);
}

void
kvp_node_env_init(struct kvp_node_env *env)
{
	memset(env, 0, sizeof(*env));
	env->rdma_ports = -ENOSYS;
	snprintf(env->rdma_why, sizeof(env->rdma_why), "not probed (transport = tcp)");
	snprintf(env->transport_why, sizeof(env->transport_why), "configured");
}

int
kvp_node_init(struct kvp_node *n, const struct kvp_config *cfg,
	      const struct kvp_node_env *env, char *err, size_t errlen)
{
	const struct kvp_transport_ops *const *tps = env->tps;
	unsigned ntps = env->ntps, nworkers = env->nworkers;
	int rc, admin_lock = -1;

	memset(n, 0, sizeof(*n));
	if (ntps == 0 || ntps > KVP_TP_MAX || nworkers == 0 || nworkers > KVP_WORKERS_MAX) {
		snprintf(err, errlen, "%u transport(s) and %u worker(s): 1..%u and 1..%u", ntps,
			 nworkers, KVP_TP_MAX, KVP_WORKERS_MAX);
		return -EINVAL;
	}
	n->cfg = *cfg;
	n->env = *env;
	n->tops = tps[0];
	n->start_ns = kvp_mono_ns();
	n->client_lfd = n->admin_lfd = n->peer_lfd = n->lock_fd = n->stats_dfd = -1;
	n->loop.epfd = n->loop.evfd = n->loop.spare_fd = -1;
	n->jobs.evfd = n->jobs.watch.fd = -1;
	for (unsigned i = 0; i < KVP_DNS_THREADS; i++)
		n->dns.s[i].watch.fd = -1;
	n->client_lw.fd = n->admin_lw.fd = n->peer_lw.fd = -1;
	for (unsigned i = 0; i < KVP_ADMIN_CONNS; i++)
		n->admin[i].fd = -1;
	for (unsigned i = 0; i < KVP_PENDING_MAX; i++)
		n->pending[i].fd = -1;

	rc = kvp_region_table_init(&n->regions, cfg->max_regions);
	if (rc < 0) {
		snprintf(err, errlen, "region table: %s", strerror(-rc));
		return rc;
	}
	n->clients = calloc(cfg->max_clients, sizeof(*n->clients));
	/* The Prometheus text is rendered into one buffer for the file and the admin socket. */
	n->stats_len = kvp_stats_text_max(cfg);
	n->stats_buf = malloc(n->stats_len);
	if (!n->stats_buf) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto err;
	}
	for (unsigned i = 0; i < KVP_ADMIN_CONNS && n->clients; i++) {
		n->admin[i].buf = malloc(KVP_ADMIN_LINEMAX);
		if (!n->admin[i].buf) {
			rc = -ENOMEM;
			snprintf(err, errlen, "out of memory");
			goto err;
		}
	}
	n->msg_pool = rte_mempool_create("kvp_msg", MSG_POOL_SIZE, sizeof(struct kvp_msg), 32, 0,
					 NULL, NULL, NULL, NULL, rte_socket_id(), 0);
	if (!n->msg_pool) {
		/* Usually a missing mempool driver: Debian ships it as an EAL plugin. */
		snprintf(err, errlen,
			 "message pool: %s (is DPDK's mempool ring driver loadable? pass "
			 "-d librte_mempool_ring.so if DPDK's plugin directory is absent)",
			 rte_strerror(rte_errno));
		rc = -ENOMEM;
		goto err;
	}
	rc = loop_init(n);
	if (rc == 0)
		rc = jobs_init(n);
	if (!n->clients || !n->msg_pool || rc < 0) {
		snprintf(err, errlen, "control plane resources: %s", strerror(rc < 0 ? -rc : ENOMEM));
		rc = rc < 0 ? rc : -ENOMEM;
		goto err;
	}

	if (nworkers * cfg->tcp_conns > KVP_LINKS_MAX) {
		snprintf(err, errlen,
			 "%u workers x tcp.connections %u: at most %u links per peer; lower "
			 "tcp.connections or run fewer workers",
			 nworkers, cfg->tcp_conns, KVP_LINKS_MAX);
		rc = -EINVAL;
		goto err;
	}
	n->workers = calloc(nworkers, sizeof(*n->workers));
	n->client_worker = calloc(cfg->max_clients, sizeof(*n->client_worker));
	if (!n->workers || !n->client_worker) {
		rc = -ENOMEM;
		goto err;
	}
	for (unsigned i = 0; i < nworkers; i++) {
		struct kvp_worker *w = &n->workers[i];

		rc = kvp_worker_init(w, i, &n->cfg, &n->regions, n->msg_pool);
		w->lcore = env->lcores[i];
		w->main_evfd = n->loop.evfd;
		n->nworkers = i + 1;
		if (rc < 0) {
			snprintf(err, errlen, "worker %u: %s", i, strerror(-rc));
			goto err;
		}
	}
	/* The workers know each other before their transports start. */
	rc = kvp_workers_join(n->workers, nworkers, n->client_worker);
	if (rc < 0) {
		snprintf(err, errlen, "cross-worker rings: %s", strerror(-rc));
		goto err;
	}
	for (unsigned i = 0; i < nworkers; i++) {
		struct kvp_worker *w = &n->workers[i];

		rc = kvp_worker_transports(w, tps, ntps);
		if (rc < 0) {
			snprintf(err, errlen, "worker %u (%s transport): %s", i, tps[w->ntp]->name,
				 strerror(-rc));
			goto err;
		}
	}

	/*
	 * Both sockets in one missing directory but for different groups: 0755
	 * (the sockets' own 0660 modes and SO_PEERCRED still decide who gets in).
	 */
	char cdir[KVP_PATH_MAX], adir[KVP_PATH_MAX];

	snprintf(cdir, sizeof(cdir), "%s", cfg->client_socket);
	snprintf(adir, sizeof(adir), "%s", cfg->admin_socket);
	char *cs = strrchr(cdir, '/'), *as = strrchr(adir, '/');

	/* Relative paths without a '/': the current directory, never created. */
	*(cs ? cs : cdir) = '\0';
	*(as ? as : adir) = '\0';
	mode_t dmode = strcmp(cdir, adir) == 0 && cfg->client_group.gid != cfg->admin_group.gid &&
			       (cfg->client_group.name[0] || cfg->admin_group.name[0])
			       ? 0755
			       : 0750;

	rc = sock_dir(cfg->client_socket, &cfg->client_group, dmode, err, errlen);
	if (rc == 0)
		rc = sock_dir(cfg->admin_socket, &cfg->admin_group, dmode, err, errlen);
	if (rc < 0)
		goto err;
	rc = unix_listen(cfg->client_socket, &cfg->client_group, &n->lock_fd, err, errlen);
	if (rc < 0)
		goto err;
	n->client_lfd = rc;
	rc = unix_listen(cfg->admin_socket, &cfg->admin_group, &admin_lock, err, errlen);
	if (rc < 0)
		goto err;
	n->admin_lfd = rc;
	/* One lock fd is enough to keep: the admin lock lives as long as the process. */
	(void)admin_lock;
	/* Each module watches what it owns and registers its methods, messages and timers. */
	rc = client_srv_init(n);
	if (rc == 0)
		rc = admin_conn_init(n);
	if (rc < 0) {
		snprintf(err, errlen, "control plane sockets: %s", strerror(-rc));
		goto err;
	}
	admin_methods_init(n);
	peer_admin_init(n);
	reload_init(n);
	rails_init(n);
	doctor_init(n);
	stats_init(n);
	stats_file_init(n);
	loop_every(n, &n->reap_timer, REAP_PERIOD_NS, reap);
	/* The table before the listener: a peer that connects at once finds its slot. */
	rc = peer_table_init(n, err, errlen);
	if (rc == 0)
		rc = peer_init(n, err, errlen);
	if (rc < 0)
		goto err;
	return 0;
err:
	kvp_node_fini(n);
	return rc < 0 ? rc : -ENOMEM;
}

void
kvp_node_poll(struct kvp_node *n, int timeout_ms)
{
	loop_run(n, timeout_ms);
}

void
kvp_node_stop_workers(struct kvp_node *n)
{
	for (unsigned i = 0; i < n->nworkers; i++) {
		struct kvp_msg *m = ctrl_msg(n, KVP_MSG_QUIT);

		n->workers[i].quit = true;
		if (m)
			ctrl_send(n, i, m);
	}
}

void
kvp_node_fini(struct kvp_node *n)
{
	/* A name being resolved is not waited for; registrations under way end first. */
	peer_dns_stop(n);
	jobs_fini(n);
	kvp_admin_close_all(n);
	kvp_peer_close_all(n);
	for (uint32_t i = 0; n->clients && i < n->cfg.max_clients; i++) {
		struct kvp_client_conn *c = &n->clients[i];

		if (c->state == KVP_CL_FREE)
			continue;
		if (c->sock >= 0)
			close(c->sock);
		if (c->chan) {
			munmap(c->chan->mem, c->chan->len);
			close(c->chan->notify_fd);
			free(c->chan);
		}
	}
	for (unsigned i = 0; i < n->nworkers; i++)
		kvp_worker_fini(&n->workers[i]); /* its transports too */
	free(n->workers);
	n->workers = NULL;
	free(n->client_worker);
	n->client_worker = NULL;
	if (n->client_lfd >= 0) {
		close(n->client_lfd);
		unlink_socket(n->cfg.client_socket);
	}
	if (n->admin_lfd >= 0) {
		close(n->admin_lfd);
		unlink_socket(n->cfg.admin_socket);
	}
	if (n->lock_fd >= 0)
		close(n->lock_fd);
	if (n->stats_dfd >= 0)
		close(n->stats_dfd);
	loop_fini(n);
	for (unsigned i = 0; i < KVP_ADMIN_CONNS; i++)
		free(n->admin[i].buf);
	rte_mempool_free(n->msg_pool);
	free(n->stats_buf);
	n->stats_buf = NULL;
	free(n->admin_reply);
	n->admin_reply = NULL;
	free(n->clients);
	n->clients = NULL;
	free(n->reg_jobs);
	n->reg_jobs = NULL;
	peer_table_fini(n);
	if (n->regions.slots)
		kvp_region_table_fini(&n->regions);
}
