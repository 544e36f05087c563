/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit test for lib/rings, the client ABI channel: both rings at once
 * across fork() over a memfd, each side with its own mapping, as kvproxyd
 * and a client run them. Consumers block only through the need_wakeup
 * protocol and an eventfd, never on a timer, so a lost wakeup becomes a
 * failure after WAIT_TIMEOUT_MS instead of a hang or a slow pass; every
 * entry is checked for loss, duplication, reordering and torn payload.
 * (Single-process cases: test_rings_chan and test_rings_spsc.)
 *
 * Usage: test_rings_stress [ENTRIES]	(entries per direction)
 * Exit: 0 pass, 1 fail, 99 when the test's own setup broke.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <assert.h> /* static_assert in kvp_rings.h, C11 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvp_rings.h"
#include "kvp_test.h"
#include "ring_entries.h"

#define WAIT_TIMEOUT_MS 30000
#define STRESS_RING     64 /* small: the stress run wraps constantly and is often full */
#define STRESS_BULK_MAX 33
#define STRESS_DEFAULT  2000000ull

/* Shared between parent and child, outside the channel. */
struct stress_ctl {
	_Atomic int abort; /* set by whichever side fails first */
};

static struct stress_ctl *g_ctl;
static int g_efd[2]; /* SQ doorbell (client -> daemon), CQ notify (daemon -> client) */

struct stress {
	const char *name;
	struct kvp_ring *r;
	uint64_t total;
	uint64_t seed; /* bulk and burst sizes */
	int efd;       /* written by the producer, read by the consumer */
	int peer_fd;   /* read end of a pipe whose writer is the other process */
	uint64_t waits, wakes, full_spins;
	char err[320];
};

static void __attribute__((format(printf, 2, 3)))
stress_fail(struct stress *s, const char *fmt, ...)
{
	static const uint64_t one = 1;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(s->err, sizeof(s->err), fmt, ap);
	va_end(ap);
	/* Wake every blocked consumer on both sides so nobody waits out the timeout. */
	atomic_store(&g_ctl->abort, 1);
	for (int i = 0; i < 2; i++)
		if (write(g_efd[i], &one, sizeof(one)) < 0)
			continue;
}

static bool
peer_gone(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR));
}

/* The ring stayed full: say whether the consumer is asleep on it. */
static void
stress_full_stuck(struct stress *s, uint64_t seq)
{
	if (peer_gone(s->peer_fd))
		stress_fail(s, "%s: consumer exited, ring full at seq %" PRIu64, s->name, seq);
	else if (atomic_load(&s->r->shm->need_wakeup))
		stress_fail(s,
			    "%s: LOST WAKEUP: ring full at seq %" PRIu64 " and the consumer is "
			    "blocked (need_wakeup set)",
			    s->name, seq);
	else
		stress_fail(s, "%s: ring full at seq %" PRIu64 " past the timeout, consumer stuck",
			    s->name, seq);
}

static void *
stress_produce(void *arg)
{
	static const uint64_t one = 1;
	struct stress *s = arg;
	uint32_t esize = s->r->esize;
	uint8_t buf[STRESS_BULK_MAX * ESIZE_MAX];
	uint64_t seq = 0;

	while (seq < s->total) {
		uint32_t n = 1 + (uint32_t)(kvp_test_splitmix64(&s->seed) % STRESS_BULK_MAX);
		uint64_t deadline = 0;
		unsigned spins = 0;
		int rc;

		if (n > s->total - seq)
			n = (uint32_t)(s->total - seq);
		fill_seq(buf, esize, seq, n);
		/* Full: spin politely; the ring has no producer-side wakeup. */
		while ((rc = kvp_ring_enqueue_bulk(s->r, buf, n)) == 0) {
			uint32_t prod =
				atomic_load_explicit(&s->r->shm->prod, memory_order_relaxed);

			if (prod != s->r->local) {
				stress_fail(s, "%s: refused bulk moved prod %u -> %u", s->name,
					    s->r->local, prod);
				return NULL;
			}
			s->full_spins++;
			if (++spins % 256 == 0) {
				if (atomic_load(&g_ctl->abort))
					return NULL;
				/* Later than the consumer's timeout: its report is sharper. */
				if (deadline == 0)
					deadline = kvp_test_now_ms() + WAIT_TIMEOUT_MS + 5000;
				if (peer_gone(s->peer_fd) || kvp_test_now_ms() > deadline) {
					stress_full_stuck(s, seq);
					return NULL;
				}
			}
			sched_yield();
		}
		if (rc != (int)n) {
			stress_fail(s, "%s: enqueue_bulk(%u) returned %d at seq %" PRIu64, s->name,
				    n, rc, seq);
			return NULL;
		}
		seq += n;
		if (kvp_ring_wakeup_needed(s->r)) {
			s->wakes++;
			if (write(s->efd, &one, sizeof(one)) != sizeof(one)) {
				stress_fail(s, "%s: eventfd write: %s", s->name, strerror(errno));
				return NULL;
			}
		}
	}
	return NULL;
}

/* Block until the producer rings; false (with s->err set) if it never does. */
static bool
stress_wait(struct stress *s, uint64_t got)
{
	struct pollfd p[2] = {
		{ .fd = s->efd, .events = POLLIN },
		{ .fd = s->peer_fd, .events = POLLIN },
	};
	uint64_t v;
	int rc;

	do
		rc = poll(p, 2, WAIT_TIMEOUT_MS);
	while (rc < 0 && errno == EINTR);
	if (rc < 0) {
		stress_fail(s, "%s: poll: %s", s->name, strerror(errno));
		return false;
	}
	if (p[0].revents & POLLIN) {
		if (read(s->efd, &v, sizeof(v)) != sizeof(v)) {
			stress_fail(s, "%s: eventfd read: %s", s->name, strerror(errno));
			return false;
		}
		return true;
	}
	/*
	 * No doorbell. Entries in the ring now mean the producer published
	 * after our flag was visible and did not ring: a lost wakeup.
	 */
	int ready = kvp_ring_count(s->r);

	const char *why = rc == 0 ? "no doorbell within the timeout" : "producer process exited";

	if (ready > 0)
		stress_fail(s,
			    "%s: LOST WAKEUP: %d entries ready, %s (%" PRIu64 "/%" PRIu64
			    " received, need_wakeup=%u)",
			    s->name, ready, why, got, s->total,
			    atomic_load(&s->r->shm->need_wakeup));
	else
		stress_fail(s, "%s: ring empty, %s (%" PRIu64 "/%" PRIu64 " received, count %d)",
			    s->name, why, got, s->total, ready);
	return false;
}

static void *
stress_consume(void *arg)
{
	struct stress *s = arg;
	uint32_t esize = s->r->esize;
	uint8_t buf[STRESS_BULK_MAX * ESIZE_MAX];
	uint64_t seq = 0;

	while (seq < s->total) {
		uint32_t n = 1 + (uint32_t)(kvp_test_splitmix64(&s->seed) % STRESS_BULK_MAX);
		int rc = kvp_ring_dequeue_burst(s->r, buf, n);

		if (rc < 0 || rc > (int)n) {
			stress_fail(s, "%s: dequeue_burst(%u) returned %d at seq %" PRIu64, s->name,
				    n, rc, seq);
			return NULL;
		}
		for (int i = 0; i < rc; i++) {
			const uint8_t *e = buf + (size_t)i * esize;
			const char *why = entry_bad(e, esize, seq);

			if (why != NULL) {
				stress_fail(s, "%s: at seq %" PRIu64 ": %s (got seq %" PRIu64 ")",
					    s->name, seq, why, entry_seq(e));
				return NULL;
			}
			seq++;
		}
		if (rc > 0)
			continue;
		if (atomic_load(&g_ctl->abort))
			return NULL;
		if (!kvp_ring_prepare_wait(s->r))
			continue;
		s->waits++;
		bool ok = stress_wait(s, seq);

		kvp_ring_finish_wait(s->r);
		if (!ok || atomic_load(&g_ctl->abort))
			return NULL;
	}
	/* The producer sent exactly total: anything more is a duplicate. */
	int extra = kvp_ring_count(s->r);

	if (extra != 0)
		stress_fail(s, "%s: %d entries after the last one", s->name, extra);
	return NULL;
}

/* Run @p a on a new thread and @p b here; false if any of it failed. */
static bool
stress_pair(void *(*fa)(void *), struct stress *a, void *(*fb)(void *), struct stress *b)
{
	pthread_t t;
	int rc = pthread_create(&t, NULL, fa, a);

	if (rc != 0) {
		errno = rc;
		setup_failed("pthread_create");
	}
	fb(b);
	pthread_join(t, NULL);
	for (int i = 0; i < 2; i++) {
		struct stress *s = i ? b : a;

		if (s->err[0])
			fprintf(stderr, "FAIL [pid %d] %s\n", (int)getpid(), s->err);
	}
	return !a->err[0] && !b->err[0];
}

static void
stress_child(int fd, size_t len, uint64_t total, int parent_fd)
{
	struct kvp_ring sq, cq;
	/* Map afresh: the client's view is at another address than the daemon's. */
	void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	struct stress prod = { .name = "SQ producer (client)",
			       .r = &sq,
			       .total = total,
			       .seed = 11,
			       .efd = g_efd[0],
			       .peer_fd = parent_fd };
	struct stress cons = { .name = "CQ consumer (client)",
			       .r = &cq,
			       .total = total,
			       .seed = 22,
			       .efd = g_efd[1],
			       .peer_fd = parent_fd };
	int rc;

	if (mem == MAP_FAILED)
		setup_failed("child mmap");
	rc = kvp_chan_attach(mem, len, false, &sq, &cq);
	if (rc != 0) {
		fprintf(stderr, "FAIL child: kvp_chan_attach: %d\n", rc);
		_exit(1);
	}
	rc = stress_pair(stress_consume, &cons, stress_produce, &prod) ? 0 : 1;
	printf("  client: SQ producer %" PRIu64 " doorbells, %" PRIu64
	       " full spins; CQ consumer %" PRIu64 " waits\n",
	       prod.wakes, prod.full_spins, cons.waits);
	fflush(NULL);
	_exit(rc);
}

static void
test_two_process(uint64_t total)
{
	uint32_t sqn = STRESS_RING, cqn = STRESS_RING;
	size_t len = kvp_chan_size(sqn, cqn);
	int fd = memfd_create("kvp-test-chan", MFD_CLOEXEC);
	int child_alive[2], parent_alive[2], status;
	struct kvp_ring sq, cq;
	uint64_t t0 = kvp_test_now_ms();
	void *mem;
	pid_t pid;

	if (fd < 0)
		setup_failed("memfd_create");
	if (ftruncate(fd, (off_t)len) != 0)
		setup_failed("ftruncate");
	mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (mem == MAP_FAILED)
		setup_failed("mmap");
	g_ctl = mmap(NULL, sizeof(*g_ctl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
		     0);
	if (g_ctl == MAP_FAILED)
		setup_failed("mmap ctl");
	atomic_store(&g_ctl->abort, 0);
	for (int i = 0; i < 2; i++) {
		g_efd[i] = eventfd(0, EFD_CLOEXEC);
		if (g_efd[i] < 0)
			setup_failed("eventfd");
	}
	if (pipe2(child_alive, O_CLOEXEC) != 0 || pipe2(parent_alive, O_CLOEXEC) != 0)
		setup_failed("pipe2");
	if (kvp_chan_init(mem, len, sqn, cqn, 5) != 0 ||
	    kvp_chan_attach(mem, len, true, &sq, &cq) != 0) {
		errno = EINVAL;
		setup_failed("channel");
	}

	fflush(NULL);
	pid = fork();
	if (pid < 0)
		setup_failed("fork");
	if (pid == 0) {
		close(child_alive[0]);
		close(parent_alive[1]);
		stress_child(fd, len, total, parent_alive[0]);
	}
	close(child_alive[1]);
	close(parent_alive[0]);

	struct stress cons = { .name = "SQ consumer (daemon)",
			       .r = &sq,
			       .total = total,
			       .seed = 33,
			       .efd = g_efd[0],
			       .peer_fd = child_alive[0] };
	struct stress prod = { .name = "CQ producer (daemon)",
			       .r = &cq,
			       .total = total,
			       .seed = 44,
			       .efd = g_efd[1],
			       .peer_fd = child_alive[0] };

	bool ok = stress_pair(stress_produce, &prod, stress_consume, &cons);

	if (!ok)
		kvp_test_failures++;
	if (waitpid(pid, &status, 0) != pid)
		setup_failed("waitpid");
	if (WIFSIGNALED(status))
		kvp_test_fail(__FILE__, __LINE__, "client process killed by signal %d",
			      WTERMSIG(status));
	else if (WEXITSTATUS(status) != 0)
		kvp_test_fail(__FILE__, __LINE__, "client process exited with %d",
			      WEXITSTATUS(status));
	if (ok) {
		CHECK_EQ(atomic_load(&((struct kvp_chan_hdr *)mem)->sq.prod), (uint32_t)total);
		CHECK_EQ(atomic_load(&((struct kvp_chan_hdr *)mem)->cq.cons), (uint32_t)total);
	}
	printf("two-process: %" PRIu64 " entries each way through %u-entry rings in %.2f s\n"
	       "  daemon: SQ consumer %" PRIu64 " waits; CQ producer %" PRIu64
	       " doorbells, %" PRIu64 " full spins\n",
	       total, STRESS_RING, (double)(kvp_test_now_ms() - t0) / 1000, cons.waits, prod.wakes,
	       prod.full_spins);
	munmap(mem, len);
	close(fd);
	close(child_alive[0]);
	close(parent_alive[1]);
	for (int i = 0; i < 2; i++)
		close(g_efd[i]);
}

int
main(int argc, char **argv)
{
	uint64_t total = STRESS_DEFAULT;

	if (argc > 1) {
		char *end;

		total = strtoull(argv[1], &end, 0);
		if (*end != '\0' || total == 0) {
			fprintf(stderr, "usage: %s [ENTRIES]\n", argv[0]);
			return 99;
		}
	}
	test_two_process(total);
	return kvp_test_result("test_rings_stress");
}
