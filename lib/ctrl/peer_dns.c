/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Peers' host names, resolved off the main lcore (peer.c dials the
 * answer). Up to KVP_DNS_THREADS threads, started as names need them, ask
 * the resolver one name each, so a resolver that never answers a name
 * holds that name's thread, never the main lcore nor the other names
 * (while a thread is free). All a thread shares with the main lcore is a
 * block of its own (struct kvp_dns_box): at stop a thread still inside
 * getaddrinfo() is left to finish alone and frees its block itself, so a
 * stop never waits for the resolver's timeout (glibc's: up to 5 s x 2
 * attempts x 3 servers). Answers come back through the block's eventfd.
 * With env.ctrl_inline (tests that drive the loop themselves) a name is
 * resolved inline.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "ctrl_priv.h"

struct kvp_dns_box {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int evfd;	    /* rung when an answer is in */
	bool quit;	    /* the node stops */
	bool asking;	    /* the thread is inside the resolver */
	bool thread_frees;  /* it was, at stop: the block is the thread's to free */
	bool asked;	    /* a question waits for the thread */
	bool answered;	    /* an answer waits for the main lcore */
	char host[sizeof(((struct kvp_peer *)0)->host)];
	uint16_t port;
	int rc;
	struct sockaddr_storage ss;
	socklen_t len;
};

static void
box_free(struct kvp_dns_box *b)
{
	pthread_cond_destroy(&b->cond);
	pthread_mutex_destroy(&b->lock);
	close(b->evfd);
	free(b);
}

static void *
dns_thread(void *arg)
{
	struct kvp_dns_box *b = arg;
	uint64_t one = 1;
	bool frees = false;

	pthread_mutex_lock(&b->lock);
	for (;;) {
		while (!b->asked && !b->quit)
			pthread_cond_wait(&b->cond, &b->lock);
		if (b->quit)
			break;
		char host[sizeof(b->host)];
		uint16_t port = b->port;
		struct sockaddr_storage ss;
		socklen_t len = 0;

		memcpy(host, b->host, sizeof(host));
		b->asked = false;
		b->asking = true;
		pthread_mutex_unlock(&b->lock);
		int rc = peer_resolve(host, port, false, false, &ss, &len);

		pthread_mutex_lock(&b->lock);
		b->asking = false;
		if (b->quit) {
			frees = b->thread_frees;
			break;
		}
		b->rc = rc;
		b->ss = ss;
		b->len = len;
		b->answered = true;
		if (write(b->evfd, &one, sizeof(one)) < 0) {
			/* EAGAIN: already rung. */
		}
	}
	pthread_mutex_unlock(&b->lock);
	if (frees)
		box_free(b);
	return NULL;
}

static void dns_answer(struct kvp_node *n, struct kvp_dns_slot *d, int rc,
		       const struct sockaddr_storage *ss, socklen_t len);

static void
on_answer(struct kvp_node *n, void *arg, uint32_t events)
{
	struct kvp_dns_slot *d = arg;
	struct kvp_dns_box *b = d->box;
	struct sockaddr_storage ss;
	socklen_t len;
	uint64_t v;
	int rc;

	(void)events;
	if (read(b->evfd, &v, sizeof(v)) < 0) {
		/* EAGAIN: a previous pass took it. */
	}
	pthread_mutex_lock(&b->lock);
	if (!b->answered) {
		pthread_mutex_unlock(&b->lock);
		return;
	}
	b->answered = false;
	rc = b->rc;
	ss = b->ss;
	len = b->len;
	pthread_mutex_unlock(&b->lock);
	dns_answer(n, d, rc, &ss, len);
}

/* Slot @p d's thread and its block, the first time a name needs them. @return 0, -errno */
static int
dns_start(struct kvp_node *n, struct kvp_dns_slot *d)
{
	struct kvp_dns_box *b = calloc(1, sizeof(*b));
	int rc = -ENOMEM;

	if (!b)
		return -ENOMEM;
	b->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (b->evfd < 0) {
		rc = -errno;
		free(b);
		return rc;
	}
	if (pthread_mutex_init(&b->lock, NULL) != 0 || pthread_cond_init(&b->cond, NULL) != 0)
		goto fail;
	rc = -pthread_create(&d->thread, NULL, dns_thread, b);
	if (rc < 0)
		goto fail;
	pthread_setname_np(d->thread, "kvp-dns");
	rc = loop_watch(n, &d->watch, b->evfd, EPOLLIN, on_answer, d);
	if (rc < 0) {
		pthread_mutex_lock(&b->lock);
		b->quit = true; /* idle: it leaves at once */
		pthread_cond_signal(&b->cond);
		pthread_mutex_unlock(&b->lock);
		pthread_join(d->thread, NULL);
		box_free(b);
		return rc;
	}
	d->box = b;
	return 0;
fail:
	close(b->evfd);
	free(b);
	return rc;
}

/* The answer for slot @p d's name: dial it, unless the peer changed meanwhile. */
static void
dns_answer(struct kvp_node *n, struct kvp_dns_slot *d, int rc, const struct sockaddr_storage *ss,
	   socklen_t len)
{
	struct kvp_peer *p = &n->peers[d->peer];

	d->busy = false;
	/* The slot may have been removed, or taken by another peer, meanwhile. */
	if (p->slot_state == KVP_PS_ACTIVE && p->gen == d->gen &&
	    p->out_state == KVP_LINK_RESOLVING && p->port == d->port &&
	    strcmp(p->host, d->host) == 0)
		peer_resolved(n, d->peer, rc, ss, len);
	peer_dns_next(n);
}

/* Peer @p i's name is with a thread already. */
static bool
dns_asked(const struct kvp_dns *dns, uint16_t i, uint8_t gen)
{
	for (unsigned k = 0; k < KVP_DNS_THREADS; k++)
		if (dns->s[k].busy && dns->s[k].peer == i && dns->s[k].gen == gen)
			return true;
	return false;
}

/* A slot free to take a name: a started one first. NULL if all are busy. */
static struct kvp_dns_slot *
dns_free(struct kvp_dns *dns)
{
	struct kvp_dns_slot *fresh = NULL;

	for (unsigned k = 0; k < KVP_DNS_THREADS; k++) {
		struct kvp_dns_slot *d = &dns->s[k];

		if (d->busy)
			continue;
		if (d->box)
			return d;
		if (!fresh)
			fresh = d;
	}
	return fresh;
}

void
peer_dns_next(struct kvp_node *n)
{
	struct kvp_dns *dns = &n->dns;

	for (uint16_t i = 0; i < n->cfg.max_peers && !dns->stopped; i++) {
		const struct kvp_peer *p = &n->peers[i];
		struct kvp_dns_slot *d;

		if (p->slot_state != KVP_PS_ACTIVE || p->out_state != KVP_LINK_RESOLVING ||
		    dns_asked(dns, i, p->gen))
			continue;
		d = dns_free(dns);
		if (!d)
			return; /* the next answer asks again */
		d->peer = i;
		d->gen = p->gen;
		d->port = p->port;
		snprintf(d->host, sizeof(d->host), "%s", p->host);
		int rc = n->env.ctrl_inline || d->box ? 0 : dns_start(n, d);

		if (rc < 0)
			KVP_LOG_RL(WARNING, core,
				   "peer names: no resolver thread (%s): %s is "
				   "resolved on the main loop",
				   strerror(-rc), d->host);
		if (n->env.ctrl_inline || rc < 0) {
			struct sockaddr_storage ss;
			socklen_t len = 0;
			d->busy = true;
			rc = peer_resolve(d->host, d->port, false, false, &ss, &len);
			dns_answer(n, d, rc, &ss, len); /* the next ones, if any, from there */
			return;
		}
		struct kvp_dns_box *b = d->box;

		d->busy = true;
		pthread_mutex_lock(&b->lock);
		memcpy(b->host, d->host, sizeof(b->host));
		b->port = d->port;
		b->asked = true;
		pthread_cond_signal(&b->cond);
		pthread_mutex_unlock(&b->lock);
	}
}

/* Stop slot @p d's thread; one inside the resolver is left to finish alone. */
static void
dns_slot_stop(struct kvp_node *n, struct kvp_dns_slot *d)
{
	struct kvp_dns_box *b = d->box;
	bool asking;

	if (!b)
		return;
	loop_unwatch(n, &d->watch);
	pthread_mutex_lock(&b->lock);
	b->quit = true;
	asking = b->thread_frees = b->asking;
	pthread_cond_signal(&b->cond);
	pthread_mutex_unlock(&b->lock);
	d->box = NULL;
	if (asking) {
		/* Inside the resolver: it frees the block once that returns. */
		KVP_LOG(NOTICE, core, "peer names: not waiting for the resolver (asked for %s)",
			d->host);
		pthread_detach(d->thread);
		return;
	}
	pthread_join(d->thread, NULL);
	box_free(b);
}

void
peer_dns_stop(struct kvp_node *n)
{
	n->dns.stopped = true;
	for (unsigned k = 0; k < KVP_DNS_THREADS; k++)
		dns_slot_stop(n, &n->dns.s[k]);
}
