/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helper threads for the control plane's slow steps: mapping and
 * populating a region, importing GPU memory, the transports' registration
 * hooks (RDMA memory registration), unmapping. The main lcore's loop posts
 * a job; a helper runs it; its done() comes back through the loop (an
 * eventfd it watches), so heartbeats, admin replies and other clients'
 * handshakes never wait behind a gigabyte being mapped. Jobs belong to the
 * callers (embedded in what they work for): nothing here allocates.
 *
 * Region slots that are removed go the same way (kvp_region_table_defer()):
 * the removal returns at once, the unmapping runs on a helper.
 *
 * With env.ctrl_inline (tests and fuzzing that drive the loop themselves)
 * no thread starts and each job runs, and is done, when posted.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "ctrl_priv.h"

static void *
helper(void *arg)
{
	struct kvp_jobs *q = arg;
	uint64_t one = 1;

	pthread_mutex_lock(&q->lock);
	for (;;) {
		while (!q->q_head && !q->quit)
			pthread_cond_wait(&q->cond, &q->lock);
		/* Shutting down: what was posted still runs (its fds and mappings go). */
		struct kvp_job *j = q->q_head;

		if (!j)
			break;
		q->q_head = j->next;
		if (!q->q_head)
			q->q_tail = NULL;
		pthread_mutex_unlock(&q->lock);
		j->run(j);
		pthread_mutex_lock(&q->lock);
		j->next = NULL;
		if (q->done_tail)
			q->done_tail->next = j;
		else
			q->done_head = j;
		q->done_tail = j;
		if (write(q->evfd, &one, sizeof(one)) < 0) {
			/* EAGAIN: already rung. */
		}
	}
	pthread_mutex_unlock(&q->lock);
	return NULL;
}

/* The jobs the helpers ran: their done() on the main lcore. */
static void
reap_done(struct kvp_node *n)
{
	struct kvp_jobs *q = &n->jobs;
	struct kvp_job *j;

	pthread_mutex_lock(&q->lock);
	j = q->done_head;
	q->done_head = q->done_tail = NULL;
	pthread_mutex_unlock(&q->lock);
	while (j) {
		struct kvp_job *next = j->next;

		q->busy--;
		q->ran++;
		j->done(n, j);
		j = next;
	}
}

static void
on_done(struct kvp_node *n, void *arg, uint32_t events)
{
	uint64_t v;

	(void)arg;
	(void)events;
	if (read(n->jobs.evfd, &v, sizeof(v)) < 0) {
		/* EAGAIN: a previous pass took it. */
	}
	reap_done(n);
}

void
job_post(struct kvp_node *n, struct kvp_job *j)
{
	struct kvp_jobs *q = &n->jobs;

	q->busy++;
	if (q->nth == 0) {
		j->run(j);
		q->busy--;
		q->ran++;
		j->done(n, j);
		return;
	}
	j->next = NULL;
	pthread_mutex_lock(&q->lock);
	if (q->q_tail)
		q->q_tail->next = j;
	else
		q->q_head = j;
	q->q_tail = j;
	pthread_cond_signal(&q->cond);
	pthread_mutex_unlock(&q->lock);
}

/* ---- region slots: unmapped on a helper once removed ---- */

struct kvp_rel_job {
	struct kvp_job job;
	struct kvp_region_table *t;
	uint32_t slot;
};

static void
rel_run(struct kvp_job *j)
{
	struct kvp_rel_job *r = (struct kvp_rel_job *)j;

	kvp_region_release(r->t, r->slot);
}

static void
rel_done(struct kvp_node *n, struct kvp_job *j)
{
	struct kvp_rel_job *r = (struct kvp_rel_job *)j;

	kvp_region_free(&n->regions, r->slot);
}

static void
defer_release(void *arg, uint32_t slot)
{
	struct kvp_node *n = arg;
	struct kvp_rel_job *r = &n->rel_jobs[slot];

	r->job.run = rel_run;
	r->job.done = rel_done;
	r->t = &n->regions;
	r->slot = slot;
	job_post(n, &r->job);
}

int
jobs_init(struct kvp_node *n)
{
	struct kvp_jobs *q = &n->jobs;
	int rc;

	q->evfd = -1;
	q->watch.fd = -1;
	n->rel_jobs = calloc(n->cfg.max_regions, sizeof(*n->rel_jobs));
	if (!n->rel_jobs || pthread_mutex_init(&q->lock, NULL) != 0)
		return -ENOMEM;
	if (pthread_cond_init(&q->cond, NULL) != 0) {
		pthread_mutex_destroy(&q->lock);
		return -ENOMEM;
	}
	q->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (q->evfd < 0)
		return -errno;
	rc = loop_watch(n, &q->watch, q->evfd, EPOLLIN, on_done, NULL);
	if (rc < 0)
		return rc;
	kvp_region_table_defer(&n->regions, defer_release, n);
	if (n->env.ctrl_inline)
		return 0;
	for (unsigned i = 0; i < KVP_JOB_THREADS; i++) {
		rc = pthread_create(&q->th[i], NULL, helper, q);
		if (rc != 0) {
			KVP_LOG(WARNING, core, "control-plane helper thread %u: %s%s", i, strerror(rc),
				q->nth ? "" : "; slow steps run on the main lcore");
			break;
		}
		pthread_setname_np(q->th[i], "kvp-ctrl-helper");
		q->nth++;
	}
	return 0;
}

void
jobs_fini(struct kvp_node *n)
{
	struct kvp_jobs *q = &n->jobs;

	if (q->evfd < 0 && !n->rel_jobs)
		return;
	if (q->evfd >= 0) {
		pthread_mutex_lock(&q->lock);
		q->quit = true;
		pthread_cond_broadcast(&q->cond);
		pthread_mutex_unlock(&q->lock);
		for (unsigned i = 0; i < q->nth; i++)
			pthread_join(q->th[i], NULL);
		q->nth = 0;
		reap_done(n);
		loop_unwatch(n, &q->watch);
		close(q->evfd);
		q->evfd = -1;
		pthread_cond_destroy(&q->cond);
		pthread_mutex_destroy(&q->lock);
	}
	/* From here a removed region is unmapped at once (the table's fini). */
	kvp_region_table_defer(&n->regions, NULL, NULL);
	free(n->rel_jobs);
	n->rel_jobs = NULL;
}
