/* SPDX-License-Identifier: BSD-3-Clause */
/* Prometheus text exposition of every counter and histogram, and the periodic stats file. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fcntl.h>
#include <inttypes.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <jansson.h>
#include <rte_lcore.h>

#include "admin_priv.h"


struct pbuf {
	char *p;
	size_t len;
	size_t cap;
};

static void __attribute__((format(printf, 2, 3)))
pb(struct pbuf *b, const char *fmt, ...)
{
	va_list ap;
	int w;

	if (b->len >= b->cap)
		return;
	va_start(ap, fmt);
	w = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	if (w > 0)
		b->len = b->len + (size_t)w < b->cap ? b->len + (size_t)w : b->cap;
}

static void
head(struct pbuf *b, const char *name, const char *type, const char *help)
{
	pb(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One histogram series: buckets at the power-of-two bounds, cumulative, then sum and count. */
static void
hist_prom(struct pbuf *b, const struct kvp_node *n, const char *name, uint16_t peer, int ph)
{
	struct kvp_hist h;
	uint64_t cum = 0;
	char labels[160];

	admin_hist_of(n, peer, ph, &h);
	snprintf(labels, sizeof(labels), "node=\"%s\",peer=\"%s\",transport=\"%s\",phase=\"%s\"",
		 n->cfg.node_id, n->cfg.peers[peer].node_id, n->tops->name, kvp_hphase_name(ph));
	for (unsigned i = 0; i < KVP_HIST_BUCKETS - 1; i++) {
		uint64_t up = kvp_hist_upper(i);

		cum += h.b[i];
		if (up & (up - 1))
			continue; /* exposed at powers of two; finer buckets feed the quantiles */
		pb(b, "%s_bucket{%s,le=\"%.9g\"} %" PRIu64 "\n", name, labels, (double)up / 1e9, cum);
	}
	cum += h.b[KVP_HIST_BUCKETS - 1];
	pb(b, "%s_bucket{%s,le=\"+Inf\"} %" PRIu64 "\n", name, labels, cum);
	pb(b, "%s_sum{%s} %.9f\n", name, labels, (double)h.sum_ns / 1e9);
	pb(b, "%s_count{%s} %" PRIu64 "\n", name, labels, cum);
}

/* RDMA: per-rail traffic (the KV route without reading NIC counters), QPs, WC errors, MRs. */
static void
prom_rails(const struct kvp_node *n, struct pbuf *b)
{
	struct kvp_rail_stats r[KVP_WIRE_RAILS_MAX];
	uint64_t wc[KVP_WC_STATUS_MAX], xfers, fallbacks;
	const char *node = n->cfg.node_id;
	static const struct {
		const char *name, *type, *help;
		size_t off;
	} rc[] = {
		{ "kvproxy_rail_tx_bytes_total", "counter", "Bytes written to peers through the rail.",
		  offsetof(struct kvp_rail_stats, tx_bytes) },
		{ "kvproxy_rail_tx_writes_total", "counter", "RDMA WRITEs posted on the rail.",
		  offsetof(struct kvp_rail_stats, tx_wrs) },
		{ "kvproxy_rail_rx_notices_total", "counter", "Transfers completed here through the rail.",
		  offsetof(struct kvp_rail_stats, rx_imms) },
		{ "kvproxy_rail_qps_up", "gauge", "Send queue pairs connected on the rail.",
		  offsetof(struct kvp_rail_stats, qps_up) },
		{ "kvproxy_rail_qp_resets_total", "counter", "Queue pairs torn down and rebuilt.",
		  offsetof(struct kvp_rail_stats, qp_resets) },
		{ "kvproxy_rail_wc_errors_total", "counter", "Work-completion errors on the rail.",
		  offsetof(struct kvp_rail_stats, wc_errors) },
	};

	if (!n->rail_pause)
		return;
	admin_rail_totals(n, r, wc, &xfers, &fallbacks);
	for (size_t k = 0; k < sizeof(rc) / sizeof(rc[0]); k++) {
		head(b, rc[k].name, rc[k].type, rc[k].help);
		for (unsigned i = 0; i < n->nrails && i < KVP_RAILS_MAX; i++) {
			const struct kvp_rail_info *p = &n->rails[i];

			if (p->rail < 0 || p->rail >= KVP_WIRE_RAILS_MAX)
				continue;
			pb(b, "%s{node=\"%s\",rail=\"%d\",dev=\"%s\",port=\"%u\"} %" PRIu64 "\n",
			   rc[k].name, node, p->rail, p->dev, p->port,
			   *(const uint64_t *)((const char *)&r[p->rail] + rc[k].off));
		}
	}
	head(b, "kvproxy_rail_paused", "gauge", "1 while the rail is paused (rail_pause).");
	for (unsigned i = 0; i < n->nrails && i < KVP_RAILS_MAX; i++)
		if (n->rails[i].rail >= 0)
			pb(b, "kvproxy_rail_paused{node=\"%s\",rail=\"%d\"} %d\n", node,
			   n->rails[i].rail, n->rails[i].paused);
	head(b, "kvproxy_rdma_wc_errors_total", "counter", "Work-completion errors by status.");
	for (unsigned i = 1; i < KVP_WC_STATUS_MAX; i++)
		if (wc[i])
			pb(b, "kvproxy_rdma_wc_errors_total{node=\"%s\",status=\"%s\"} %" PRIu64 "\n",
			   node, admin_wc_status_name(i), wc[i]);
	head(b, "kvproxy_rdma_transfers_total", "counter", "Transfers sent by RDMA.");
	pb(b, "kvproxy_rdma_transfers_total{node=\"%s\"} %" PRIu64 "\n", node, xfers);
	head(b, "kvproxy_rdma_tcp_fallbacks_total", "counter",
	     "Transfers that took the TCP path although RDMA was up.");
	pb(b, "kvproxy_rdma_tcp_fallbacks_total{node=\"%s\"} %" PRIu64 "\n", node, fallbacks);
	const struct kvp_mr_stats *m = n->mr_stats;
	head(b, "kvproxy_rdma_registrations_total", "counter", "Regions registered for RDMA.");
	pb(b, "kvproxy_rdma_registrations_total{node=\"%s\"} %" PRIu64 "\n", node,
	   KVP_STAT_READ(m->regs));
	head(b, "kvproxy_rdma_registration_failures_total", "counter",
	     "Regions left unregistered (their data is staged over TCP).");
	pb(b, "kvproxy_rdma_registration_failures_total{node=\"%s\"} %" PRIu64 "\n", node,
	   KVP_STAT_READ(m->failures));
	head(b, "kvproxy_rdma_registration_seconds_total", "counter", "Time spent registering memory.");
	pb(b, "kvproxy_rdma_registration_seconds_total{node=\"%s\"} %.6f\n", node,
	   (double)KVP_STAT_READ(m->reg_ns) / 1e9);
}

size_t
kvp_stats_prometheus(const struct kvp_node *n, char *out, size_t outlen)
{
	struct pbuf b = { out, 0, outlen ? outlen - 1 : 0 };
	const char *node = n->cfg.node_id, *tr = n->tops->name;
	struct totals t;

	if (outlen == 0)
		return 0;
	admin_gather(n, &t);
	head(&b, "kvproxy_uptime_seconds", "gauge", "Seconds since kvproxyd started.");
	/* The text is a snapshot: a series reads the same in every histogram line. */
	pb(&b, "kvproxy_uptime_seconds{node=\"%s\"} %.3f\n", node, admin_uptime_s(n));

	static const struct {
		const char *name, *help;
		size_t off;
	} pc[] = {
		{ "kvproxy_peer_tx_bytes_total", "Payload bytes sent to the peer.",
		  offsetof(struct kvp_peer_stats, tx_bytes) },
		{ "kvproxy_peer_rx_bytes_total", "Payload bytes received from the peer.",
		  offsetof(struct kvp_peer_stats, rx_bytes) },
		{ "kvproxy_peer_tx_transfers_total", "Transfers sent to the peer and acknowledged.",
		  offsetof(struct kvp_peer_stats, tx_xfers) },
		{ "kvproxy_peer_rx_transfers_total", "Transfers from the peer landed here.",
		  offsetof(struct kvp_peer_stats, rx_xfers) },
		{ "kvproxy_peer_tx_frames_total", "Wire frames sent to the peer.",
		  offsetof(struct kvp_peer_stats, tx_frames) },
		{ "kvproxy_peer_rx_frames_total", "Wire frames received from the peer.",
		  offsetof(struct kvp_peer_stats, rx_frames) },
		{ "kvproxy_peer_bad_frames_total", "Malformed frames received from the peer.",
		  offsetof(struct kvp_peer_stats, bad_frames) },
		{ "kvproxy_peer_connection_errors_total", "Connections to or from the peer lost.",
		  offsetof(struct kvp_peer_stats, conn_errors) },
		{ "kvproxy_peer_tcp_retransmits_total",
		  "TCP segments the kernel retransmitted on connections to the peer.",
		  offsetof(struct kvp_peer_stats, tcp_retrans) },
	};
	for (size_t k = 0; k < sizeof(pc) / sizeof(pc[0]); k++) {
		head(&b, pc[k].name, "counter", pc[k].help);
		for (uint16_t i = 0; i < n->cfg.npeers; i++)
			pb(&b, "%s{node=\"%s\",peer=\"%s\",transport=\"%s\"} %" PRIu64 "\n",
			   pc[k].name, node, n->cfg.peers[i].node_id, tr,
			   *(const uint64_t *)((const char *)&t.peer[i] + pc[k].off));
	}
	head(&b, "kvproxy_peer_up", "gauge", "1 if an outgoing connection to the peer is up.");
	for (uint16_t i = 0; i < n->cfg.npeers; i++)
		pb(&b, "kvproxy_peer_up{node=\"%s\",peer=\"%s\"} %d\n", node,
		   n->cfg.peers[i].node_id, n->peers[i].out_up != 0);
	head(&b, "kvproxy_peer_links_up", "gauge", "Outgoing TCP connections to the peer that are up.");
	for (uint16_t i = 0; i < n->cfg.npeers; i++)
		pb(&b, "kvproxy_peer_links_up{node=\"%s\",peer=\"%s\"} %d\n", node,
		   n->cfg.peers[i].node_id, __builtin_popcount(n->peers[i].out_up));
	head(&b, "kvproxy_peer_link_tx_bytes_total", "counter",
	     "Payload bytes sent to the peer per TCP connection (link).");
	for (uint16_t i = 0; i < n->cfg.npeers; i++)
		for (unsigned l = 0; l < n->cfg.tcp_conns && l < KVP_LINKS_MAX; l++)
			pb(&b, "kvproxy_peer_link_tx_bytes_total{node=\"%s\",peer=\"%s\",link=\"%u\"} %" PRIu64 "\n",
			   node, n->cfg.peers[i].node_id, l, t.peer[i].link_tx_bytes[l]);
	head(&b, "kvproxy_completions_total", "counter", "Transfers ended on this node, by status.");
	for (int c = 0; c < KVP_STATUS_MAX; c++)
		pb(&b, "kvproxy_completions_total{node=\"%s\",status=\"%s\"} %" PRIu64 "\n", node,
		   kvp_status_str(c), t.completions[c]);
	head(&b, "kvproxy_transfers_submitted_total", "counter", "Transfers picked up from clients.");
	pb(&b, "kvproxy_transfers_submitted_total{node=\"%s\"} %" PRIu64 "\n", node, t.submitted);
	head(&b, "kvproxy_transfers_landed_total", "counter", "Transfers landed into local regions.");
	pb(&b, "kvproxy_transfers_landed_total{node=\"%s\"} %" PRIu64 "\n", node, t.landed);
	head(&b, "kvproxy_transfers_inflight", "gauge", "Transfers in flight.");
	pb(&b, "kvproxy_transfers_inflight{node=\"%s\"} %u\n", node, t.inflight);
	head(&b, "kvproxy_transfers_inflight_max", "gauge", "Transfer slots (limits.max_inflight).");
	pb(&b, "kvproxy_transfers_inflight_max{node=\"%s\"} %u\n", node,
	   n->cfg.max_inflight * n->nworkers);
	head(&b, "kvproxy_transfers_inflight_high_water", "gauge", "Most transfer slots in use at once.");
	pb(&b, "kvproxy_transfers_inflight_high_water{node=\"%s\"} %" PRIu64 "\n", node, t.hwm);
	head(&b, "kvproxy_staging_buffers", "gauge", "Staging buffers in the pool.");
	pb(&b, "kvproxy_staging_buffers{node=\"%s\"} %" PRIu64 "\n", node, t.stage_bufs);
	head(&b, "kvproxy_staging_buffers_in_use", "gauge", "Staging buffers held by transfers.");
	pb(&b, "kvproxy_staging_buffers_in_use{node=\"%s\"} %" PRIu64 "\n", node, t.stage_used);
	head(&b, "kvproxy_staging_buffers_high_water", "gauge", "Most staging buffers in use at once.");
	pb(&b, "kvproxy_staging_buffers_high_water{node=\"%s\"} %" PRIu64 "\n", node, t.stage_hwm);
	head(&b, "kvproxy_staging_waits_total", "counter", "Times a frame waited for a staging buffer.");
	pb(&b, "kvproxy_staging_waits_total{node=\"%s\"} %" PRIu64 "\n", node, t.stage_waits);
	prom_rails(n, &b);
	head(&b, "kvproxy_clients", "gauge", "Connected clients.");
	pb(&b, "kvproxy_clients{node=\"%s\"} %u\n", node, n->nclients);
	head(&b, "kvproxy_regions", "gauge", "Registered regions.");
	pb(&b, "kvproxy_regions{node=\"%s\"} %u\n", node, n->regions.used);
	head(&b, "kvproxy_bad_handshakes_total", "counter", "Peer handshakes refused or failed.");
	pb(&b, "kvproxy_bad_handshakes_total{node=\"%s\"} %" PRIu64 "\n", node, n->bad_handshakes);
	head(&b, "kvproxy_auth_failures_total", "counter", "Peers refused for failed authentication.");
	pb(&b, "kvproxy_auth_failures_total{node=\"%s\"} %" PRIu64 "\n", node, n->auth_failures);
	head(&b, "kvproxy_clients_refused_total", "counter",
	     "Client connections refused: credentials (not our uid, root or client_group), "
	     "limit (limits.max_clients), fds (no file descriptor left).");
	pb(&b, "kvproxy_clients_refused_total{node=\"%s\",reason=\"credentials\"} %" PRIu64 "\n",
	   node, n->clients_refused_cred);
	pb(&b, "kvproxy_clients_refused_total{node=\"%s\",reason=\"limit\"} %" PRIu64 "\n", node,
	   n->clients_refused_limit);
	pb(&b, "kvproxy_clients_refused_total{node=\"%s\",reason=\"fds\"} %" PRIu64 "\n", node,
	   n->clients_refused_fds);
	head(&b, "kvproxy_client_accept_pauses_total", "counter",
	     "Times the client listener stopped accepting for want of file descriptors.");
	pb(&b, "kvproxy_client_accept_pauses_total{node=\"%s\"} %" PRIu64 "\n", node,
	   n->client_accept_pauses);
	head(&b, "kvproxy_client_handshake_failures_total", "counter",
	     "Client HELLOs refused (protocol, ring sizes, resources) or not sent in time.");
	pb(&b, "kvproxy_client_handshake_failures_total{node=\"%s\"} %" PRIu64 "\n", node,
	   n->client_handshake_failures);
	head(&b, "kvproxy_ring_violations_total", "counter",
	     "Clients disconnected for breaking the shared-ring protocol.");
	pb(&b, "kvproxy_ring_violations_total{node=\"%s\"} %" PRIu64 "\n", node,
	   n->ring_violations);
	head(&b, "kvproxy_admin_connections", "gauge", "Admin connections open.");
	pb(&b, "kvproxy_admin_connections{node=\"%s\"} %u\n", node, kvp_admin_open(n));
	head(&b, "kvproxy_admin_refused_total", "counter",
	     "Admin connections refused: the connection limit was reached.");
	pb(&b, "kvproxy_admin_refused_total{node=\"%s\"} %" PRIu64 "\n", node,
	   n->admin_stats.refused);
	head(&b, "kvproxy_admin_refused_fds_total", "counter",
	     "Admin connections refused: no file descriptor left.");
	pb(&b, "kvproxy_admin_refused_fds_total{node=\"%s\"} %" PRIu64 "\n", node,
	   n->admin_stats.no_fds);
	head(&b, "kvproxy_admin_cut_total", "counter",
	     "Admin connections closed by the daemon: slow (request line or reply beyond "
	     "timeouts.admin_ms), idle (timeouts.admin_idle_ms), too_long (request line).");
	static const struct {
		const char *reason;
		size_t off;
	} cut[] = {
		{ "slow", offsetof(struct kvp_admin_stats, slow) },
		{ "idle", offsetof(struct kvp_admin_stats, idle) },
		{ "too_long", offsetof(struct kvp_admin_stats, too_long) },
	};
	for (size_t k = 0; k < sizeof(cut) / sizeof(cut[0]); k++)
		pb(&b, "kvproxy_admin_cut_total{node=\"%s\",reason=\"%s\"} %" PRIu64 "\n", node,
		   cut[k].reason, *(const uint64_t *)((const char *)&n->admin_stats + cut[k].off));
	head(&b, "kvproxy_worker_busy_seconds_total", "counter", "Time worker loops found work.");
	for (unsigned w = 0; w < n->nworkers; w++)
		pb(&b, "kvproxy_worker_busy_seconds_total{node=\"%s\",lcore=\"%u\"} %.6f\n", node,
		   n->workers[w].lcore, (double)KVP_STAT_READ(n->workers[w].stats.busy_ns) / 1e9);
	head(&b, "kvproxy_worker_idle_seconds_total", "counter", "Time worker loops found none.");
	for (unsigned w = 0; w < n->nworkers; w++)
		pb(&b, "kvproxy_worker_idle_seconds_total{node=\"%s\",lcore=\"%u\"} %.6f\n", node,
		   n->workers[w].lcore, (double)KVP_STAT_READ(n->workers[w].stats.idle_ns) / 1e9);
	head(&b, "kvproxy_worker_sleeps_total", "counter", "Times a worker blocked when idle.");
	for (unsigned w = 0; w < n->nworkers; w++)
		pb(&b, "kvproxy_worker_sleeps_total{node=\"%s\",lcore=\"%u\"} %" PRIu64 "\n", node,
		   n->workers[w].lcore, KVP_STAT_READ(n->workers[w].stats.sleeps));
	head(&b, "kvproxy_draining", "gauge", "1 while the node refuses new submissions (drain).");
	pb(&b, "kvproxy_draining{node=\"%s\"} %d\n", node, n->draining);
	head(&b, "kvproxy_drain_refused_total", "counter",
	     "Submissions refused with status shutdown while draining.");
	pb(&b, "kvproxy_drain_refused_total{node=\"%s\"} %" PRIu64 "\n", node, t.drain_refused);
	head(&b, "kvproxy_deadline_misses_total", "counter", "Transfers that ended after their deadline.");
	pb(&b, "kvproxy_deadline_misses_total{node=\"%s\"} %" PRIu64 "\n", node, t.deadline_misses);
	head(&b, "kvproxy_fences_total", "counter", "Fences clients set on transfers landing here.");
	pb(&b, "kvproxy_fences_total{node=\"%s\"} %" PRIu64 "\n", node, t.fences);
	head(&b, "kvproxy_fences_held", "gauge", "Fences set and not yet expired.");
	pb(&b, "kvproxy_fences_held{node=\"%s\"} %u\n", node, t.fences_held);
	head(&b, "kvproxy_fences_forced_total", "counter",
	     "Fences that had to tear down queue pairs or connections after timeouts.peer_ms.");
	pb(&b, "kvproxy_fences_forced_total{node=\"%s\"} %" PRIu64 "\n", node, t.fences_forced);
	head(&b, "kvproxy_fences_refused_total", "counter", "Fences refused: the fence table was full.");
	pb(&b, "kvproxy_fences_refused_total{node=\"%s\"} %" PRIu64 "\n", node, t.fences_refused);
	head(&b, "kvproxy_fenced_transfers_total", "counter", "Incoming transfers a fence refused.");
	pb(&b, "kvproxy_fenced_transfers_total{node=\"%s\"} %" PRIu64 "\n", node, t.fenced_xfers);
	head(&b, "kvproxy_fenced_bytes_total", "counter", "Bytes of incoming transfers a fence dropped.");
	pb(&b, "kvproxy_fenced_bytes_total{node=\"%s\"} %" PRIu64 "\n", node, t.fenced_bytes);
	head(&b, "kvproxy_stats_enabled", "gauge", "1 if phase histograms are collected (stats.enabled).");
	pb(&b, "kvproxy_stats_enabled{node=\"%s\"} %d\n", node, n->cfg.stats_enabled);
	head(&b, "kvproxy_send_phase_seconds", "histogram",
	     "Phases of successful transfers sent to the peer: queue, admit, first_byte, send, "
	     "wire, deliver add up to total.");
	for (uint16_t p = 0; p < n->cfg.npeers; p++)
		for (int ph = 0; ph < KVP_HP_TX_MAX; ph++)
			hist_prom(&b, n, "kvproxy_send_phase_seconds", p, ph);
	head(&b, "kvproxy_receive_phase_seconds", "histogram",
	     "Phases of transfers received from the peer: receive (first byte to last byte "
	     "landed), deliver (landed to notice posted).");
	for (uint16_t p = 0; p < n->cfg.npeers; p++)
		for (int ph = KVP_HP_TX_MAX; ph < KVP_HP_MAX; ph++)
			hist_prom(&b, n, "kvproxy_receive_phase_seconds", p, ph);
	out[b.len] = '\0';
	return b.len;
}

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
	len = kvp_stats_prometheus(n, n->stats_buf, KVP_STATS_TEXT_MAX);
	/*
	 * Same directory, then rename: a collector never reads half a file, and
	 * rename() replaces whatever is at the name (a planted symlink
	 * included) without following it.
	 */
	base = strrchr(path, '/');
	base = base ? base + 1 : path;
	snprintf(dir, sizeof(dir), "%.*s", base - path > 1 ? (int)(base - path - 1) : 1, path);
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		rc = -errno;
		goto err;
	}
	fd = open_temp(dfd, base, tmp, sizeof(tmp));
	if (fd < 0) {
		rc = fd;
		goto err_close_dir;
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
	close(dfd);
	n->stats_writes++;
	return 0;

err_unlink:
	unlinkat(dfd, tmp, 0);
err_close_dir:
	close(dfd);
err:
	n->stats_write_errors++;
	KVP_LOG_RL(WARNING, core, "stats file %s: %s", path, strerror(-rc));
	return rc;
}
