/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvp-ring-bench: throughput of the kvp_rings SQ against DPDK rte_ring.
 *
 * kvp: a producer process and a consumer process sharing a memfd channel,
 * 64-byte descriptors, the way a client and kvproxyd use it. rte_ring: SP/SC
 * between two lcores of one process, once carrying pointers (its native use)
 * and once carrying 64-byte elements (rte_ring_create_elem), the like-for-like
 * comparison. Each case runs single-entry and in bursts of 32; both sides
 * busy-spin, so the figures are the rings' own cost, not wakeup latency.
 *
 * This process never initialises the EAL: forking an EAL process is not
 * supported, and kvp needs fork(). Each repetition runs the kvp cases, then
 * forks a child that initialises the EAL and runs the rte_ring cases, so both
 * see the same background load on a shared machine; ratios are taken within
 * a repetition. Both use the same two CPUs (the first two of the EAL core
 * list), consumer on the first.
 *
 * Usage: kvp-ring-bench [EAL args] -- [-n COUNT] [-r REPEAT] [--json]
 *   Without "--" every argument is an application option.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <assert.h> /* static_assert in kvp_rings.h, C11 */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_pause.h>
#include <rte_ring.h>
#include <rte_ring_elem.h>

#include "kvp_rings.h"
#include "kvp_test.h"

#define RING_SIZE     1024
#define BURST         32
#define DEFAULT_COUNT 4000000ull
#define DEFAULT_REP   5
#define REP_MAX       15
#define EAL_ARGS_MAX  64

enum bench_case {
	KVP_SINGLE,
	KVP_BURST,
	RTE_PTR_SINGLE,
	RTE_PTR_BURST,
	RTE_E64_SINGLE,
	RTE_E64_BURST,
	CASE_MAX
};

static const struct {
	const char *label;
	const char *key; /* JSON */
	uint32_t burst;
	uint32_t esize;
	bool elem; /* rte_ring of 64-byte elements rather than pointers */
} cases[CASE_MAX] = {
	[KVP_SINGLE] = { "kvp single (2 procs)", "kvp_single", 1, KVP_SQE_SIZE, false },
	[KVP_BURST] = { "kvp burst32 (2 procs)", "kvp_burst32", BURST, KVP_SQE_SIZE, false },
	[RTE_PTR_SINGLE] = { "rte_ring ptr single", "rte_ptr_single", 1, sizeof(void *), false },
	[RTE_PTR_BURST] = { "rte_ring ptr burst32", "rte_ptr_burst32", BURST, sizeof(void *),
			    false },
	[RTE_E64_SINGLE] = { "rte_ring elem64 single", "rte_elem64_single", 1, KVP_SQE_SIZE, true },
	[RTE_E64_BURST] = { "rte_ring elem64 burst32", "rte_elem64_burst32", BURST, KVP_SQE_SIZE,
			    true },
};

/* Results of one repetition. */
struct rep {
	double mops[CASE_MAX];
};

/* Start line shared by the two sides of one run (across fork for kvp). */
struct start_line {
	_Atomic int ready; /* producer is set up and spinning */
	_Atomic int go;
	_Atomic int bad; /* producer-side failure */
};

static void
pin(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) != 0)
		fprintf(stderr, "warning: cannot pin to CPU %d: %s\n", cpu, strerror(errno));
}

static void
start_wait(struct start_line *sl)
{
	atomic_store_explicit(&sl->ready, 1, memory_order_release);
	while (!atomic_load_explicit(&sl->go, memory_order_acquire))
		rte_pause();
}

/* Returns the start time; the producer is released after it is taken. */
static uint64_t
start_go(struct start_line *sl)
{
	uint64_t t0;

	while (!atomic_load_explicit(&sl->ready, memory_order_acquire))
		rte_pause();
	t0 = kvp_test_now_ns();
	atomic_store_explicit(&sl->go, 1, memory_order_release);
	return t0;
}

static void
desc_init(struct kvp_sqe_seg *d, uint32_t n)
{
	memset(d, 0, sizeof(*d) * n);
	for (uint32_t i = 0; i < n; i++) {
		d[i].op = KVP_OP_SEG;
		d[i].dst_key = 1;
		d[i].len = 4096;
	}
}

/* ---- kvp_rings, producer child and consumer parent ---- */

static _Noreturn void
kvp_produce(int fd, size_t len, struct start_line *sl, uint64_t count, uint32_t burst, int cpu)
{
	struct kvp_sqe_seg d[BURST];
	struct kvp_ring sq, cq;
	/* Own mapping, as a client has: the daemon's addresses mean nothing here. */
	void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	pin(cpu);
	if (mem == MAP_FAILED || kvp_chan_attach(mem, len, false, &sq, &cq) != 0) {
		atomic_store(&sl->bad, 1);
		atomic_store(&sl->ready, 1);
		_exit(1);
	}
	desc_init(d, BURST);
	start_wait(sl);
	for (uint64_t seq = 0; seq < count; seq += burst) {
		int rc;

		for (uint32_t i = 0; i < burst; i++)
			d[i].src_key = seq + i;
		while ((rc = kvp_ring_enqueue_bulk(&sq, d, burst)) == 0)
			rte_pause();
		if (rc < 0) {
			atomic_store(&sl->bad, 1);
			_exit(1);
		}
	}
	_exit(0);
}

/* Mops/s of one kvp run, or a negative value on failure. */
static double
kvp_run(uint64_t count, uint32_t burst, int cons_cpu, int prod_cpu)
{
	size_t len = kvp_chan_size(RING_SIZE, 64);
	struct kvp_sqe_seg d[BURST];
	struct kvp_ring sq, cq;
	struct start_line *sl;
	uint64_t t0, t1, seq = 0, errors = 0;
	cpu_set_t saved;
	int fd, status;
	void *mem;
	pid_t pid;

	fd = memfd_create("kvp-ring-bench", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
		perror("memfd");
		return -1;
	}
	mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	sl = mmap(NULL, sizeof(*sl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED || sl == MAP_FAILED) {
		perror("mmap");
		return -1;
	}
	if (kvp_chan_init(mem, len, RING_SIZE, 64, 1) != 0 ||
	    kvp_chan_attach(mem, len, true, &sq, &cq) != 0) {
		fprintf(stderr, "kvp channel setup failed\n");
		return -1;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		perror("fork");
		return -1;
	}
	if (pid == 0)
		kvp_produce(fd, len, sl, count, burst, prod_cpu);

	if (sched_getaffinity(0, sizeof(saved), &saved) != 0)
		CPU_ZERO(&saved);
	pin(cons_cpu);
	t0 = start_go(sl);
	while (seq < count && !atomic_load_explicit(&sl->bad, memory_order_relaxed)) {
		int n = kvp_ring_dequeue_burst(&sq, d, burst);

		if (n <= 0) {
			if (n < 0)
				break;
			rte_pause();
			continue;
		}
		for (int i = 0; i < n; i++)
			errors += d[i].src_key != seq++;
	}
	t1 = kvp_test_now_ns();
	/* The EAL child forked later checks its lcores against this mask. */
	if (CPU_COUNT(&saved) != 0)
		sched_setaffinity(0, sizeof(saved), &saved);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		errors++;
	munmap(mem, len);
	munmap(sl, sizeof(*sl));
	close(fd);
	if (errors != 0 || seq != count) {
		fprintf(stderr,
			"kvp burst %u: %" PRIu64 " errors, %" PRIu64 "/%" PRIu64 " received\n",
			burst, errors, seq, count);
		return -1;
	}
	return (double)count * 1e3 / (double)(t1 - t0);
}

/* ---- rte_ring, producer on a worker lcore, consumer on the main lcore ---- */

struct rte_job {
	struct rte_ring *r;
	uint64_t count;
	uint32_t burst;
	bool elem;
	struct start_line sl;
};

static int
rte_produce(void *arg)
{
	struct rte_job *j = arg;
	struct kvp_sqe_seg d[BURST];
	void *p[BURST];
	uint32_t burst = j->burst;

	desc_init(d, BURST);
	start_wait(&j->sl);
	for (uint64_t seq = 0; seq < j->count; seq += burst) {
		if (j->elem) {
			for (uint32_t i = 0; i < burst; i++)
				d[i].src_key = seq + i;
			if (burst == 1)
				while (rte_ring_sp_enqueue_elem(j->r, d, sizeof(d[0])) != 0)
					rte_pause();
			else
				while (rte_ring_sp_enqueue_bulk_elem(j->r, d, sizeof(d[0]), burst,
								     NULL) == 0)
					rte_pause();
		} else {
			/* +1: a NULL object would be indistinguishable from a bug. */
			for (uint32_t i = 0; i < burst; i++)
				p[i] = (void *)(uintptr_t)(seq + i + 1);
			if (burst == 1)
				while (rte_ring_sp_enqueue(j->r, p[0]) != 0)
					rte_pause();
			else
				while (rte_ring_sp_enqueue_bulk(j->r, p, burst, NULL) == 0)
					rte_pause();
		}
	}
	return 0;
}

static uint64_t
rte_consume(struct rte_job *j)
{
	struct kvp_sqe_seg d[BURST];
	void *p[BURST];
	uint32_t burst = j->burst;
	uint64_t seq = 0, errors = 0;

	while (seq < j->count) {
		unsigned int n;

		if (j->elem) {
			if (burst == 1)
				n = rte_ring_sc_dequeue_elem(j->r, d, sizeof(d[0])) == 0;
			else
				n = rte_ring_sc_dequeue_burst_elem(j->r, d, sizeof(d[0]), burst,
								   NULL);
			for (unsigned int i = 0; i < n; i++)
				errors += d[i].src_key != seq++;
		} else {
			if (burst == 1)
				n = rte_ring_sc_dequeue(j->r, &p[0]) == 0;
			else
				n = rte_ring_sc_dequeue_burst(j->r, p, burst, NULL);
			for (unsigned int i = 0; i < n; i++)
				errors += (uintptr_t)p[i] != ++seq;
		}
		if (n == 0)
			rte_pause();
	}
	return errors;
}

static double
rte_run(uint64_t count, uint32_t burst, bool elem, unsigned int worker)
{
	const unsigned int flags = RING_F_SP_ENQ | RING_F_SC_DEQ;
	struct rte_job j = { .count = count, .burst = burst, .elem = elem };
	uint64_t t0, t1, errors;

	if (elem)
		j.r = rte_ring_create_elem("kvpb_e64", sizeof(struct kvp_sqe_seg), RING_SIZE,
					   (int)rte_socket_id(), flags);
	else
		j.r = rte_ring_create("kvpb_ptr", RING_SIZE, (int)rte_socket_id(), flags);
	if (j.r == NULL) {
		fprintf(stderr, "rte_ring_create: %s\n", rte_strerror(rte_errno));
		return -1;
	}
	if (rte_eal_remote_launch(rte_produce, &j, worker) != 0) {
		fprintf(stderr, "rte_eal_remote_launch failed\n");
		rte_ring_free(j.r);
		return -1;
	}
	t0 = start_go(&j.sl);
	errors = rte_consume(&j);
	t1 = kvp_test_now_ns();
	rte_eal_wait_lcore(worker);
	rte_ring_free(j.r);
	if (errors != 0) {
		fprintf(stderr, "rte_ring %s burst %u: %" PRIu64 " out-of-order entries\n",
			elem ? "elem64" : "ptr", burst, errors);
		return -1;
	}
	return (double)count * 1e3 / (double)(t1 - t0);
}

/*
 * One repetition of the rte_ring cases in a child that owns the EAL; results
 * come back through @p out (shared memory). Returns 0 or -1.
 */
static int
rte_rep(int eal_argc, char **eal_argv, uint64_t count, double *out)
{
	unsigned int worker;
	int status, rc = 0;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		perror("fork");
		return -1;
	}
	if (pid > 0) {
		if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
		    WEXITSTATUS(status) != 0)
			return -1;
		return 0;
	}
	if (rte_eal_init(eal_argc, eal_argv) < 0) {
		fprintf(stderr, "rte_eal_init: %s\n", rte_strerror(rte_errno));
		_exit(1);
	}
	worker = rte_get_next_lcore(-1, 1, 0);
	if (worker >= RTE_MAX_LCORE) {
		fprintf(stderr, "need two lcores (EAL -l N,M)\n");
		rc = 1;
	}
	for (int c = RTE_PTR_SINGLE; c < CASE_MAX && rc == 0; c++) {
		out[c] = rte_run(count, cases[c].burst, cases[c].elem, worker);
		rc = out[c] < 0;
	}
	rte_eal_cleanup();
	fflush(NULL);
	_exit(rc);
}

/* ---- driver ---- */

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static _Noreturn void
usage(const char *prog)
{
	fprintf(stderr,
		"usage: %s [EAL args] -- [-n COUNT] [-r REPEAT] [--json]\n"
		"  -n COUNT   entries per run (default %llu, rounded up to a multiple of %d)\n"
		"  -r REPEAT  repetitions; median and best are reported (default %d, max %d)\n"
		"  --json     print one JSON object instead of the table\n"
		"EAL defaults, each dropped when you pass its option: -l 0,1 --no-huge -m 64\n"
		"  --no-shconf --no-pci --no-telemetry --log-level=error\n",
		prog, DEFAULT_COUNT, BURST, DEFAULT_REP, REP_MAX);
	exit(2);
}

static bool
has_opt(int argc, char **argv, const char *const *names)
{
	for (int i = 0; i < argc; i++)
		for (const char *const *n = names; *n != NULL; n++)
			if (strncmp(argv[i], *n, strlen(*n)) == 0)
				return true;
	return false;
}

/* First two CPUs of an EAL -l list ("0,1", "2-3", "4,6-7"); false if unparsable. */
static bool
corelist_first_two(const char *s, int cpu[2])
{
	int got = 0;

	while (*s != '\0' && got < 2) {
		char *end;
		long lo = strtol(s, &end, 10), hi;

		if (end == s || lo < 0 || lo >= CPU_SETSIZE)
			return false;
		hi = lo;
		if (*end == '-') {
			s = end + 1;
			hi = strtol(s, &end, 10);
			if (end == s || hi < lo || hi >= CPU_SETSIZE)
				return false;
		}
		for (long c = lo; c <= hi && got < 2; c++)
			cpu[got++] = (int)c;
		s = *end == ',' ? end + 1 : end;
	}
	return got == 2;
}

int
main(int argc, char **argv)
{
	static const char *const lcore_opts[] = { "-l", "-c", "--lcores", NULL };
	static const char *const mem_opts[] = { "-m", "--socket-mem", NULL };
	static const char *const huge_opts[] = { "--no-huge", "--huge-dir", "--socket-mem",
						 "--in-memory", NULL };
	static const char *const shconf_opts[] = { "--no-shconf", "--in-memory", "--file-prefix",
						   NULL };
	static const char *const pci_opts[] = {
		"--no-pci", "-a", "-b", "--allow", "--block", NULL
	};
	static const char *const tele_opts[] = { "--no-telemetry", "--telemetry", NULL };
	static const char *const log_opts[] = { "--log-level", NULL };
	char *eal_argv[EAL_ARGS_MAX];
	int eal_argc = 0, user_eal = 0, app_first = 1, cpu[2] = { 0, 1 };
	uint64_t count = DEFAULT_COUNT;
	unsigned int repeat = DEFAULT_REP;
	struct rep *runs; /* shared memory: the EAL child writes its cases */
	double ratio[CASE_MAX][REP_MAX], best[CASE_MAX], median[CASE_MAX];
	double kvp_ratio[CASE_MAX] = { 0 };
	bool json = false;

	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "--") == 0) {
			user_eal = i - 1;
			app_first = i + 1;
			break;
		}
	for (int i = app_first; i < argc; i++) {
		char *end;

		if (strcmp(argv[i], "--json") == 0) {
			json = true;
		} else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
			count = strtoull(argv[++i], &end, 0);
			if (*end != '\0' || count == 0)
				usage(argv[0]);
		} else if (strcmp(argv[i], "-r") == 0 && i + 1 < argc) {
			repeat = (unsigned int)strtoul(argv[++i], &end, 0);
			if (*end != '\0' || repeat == 0 || repeat > REP_MAX)
				usage(argv[0]);
		} else {
			usage(argv[0]);
		}
	}
	/* Every case moves the same number of entries, bursts included. */
	count = (count + BURST - 1) / BURST * BURST;

	/* EAL argv: program name, our defaults unless overridden, then the user's. */
	eal_argv[eal_argc++] = argv[0];
	if (!has_opt(user_eal, argv + 1, lcore_opts)) {
		eal_argv[eal_argc++] = "-l";
		eal_argv[eal_argc++] = "0,1";
	}
	if (!has_opt(user_eal, argv + 1, huge_opts))
		eal_argv[eal_argc++] = "--no-huge";
	if (!has_opt(user_eal, argv + 1, mem_opts)) {
		eal_argv[eal_argc++] = "-m";
		eal_argv[eal_argc++] = "64";
	}
	if (!has_opt(user_eal, argv + 1, shconf_opts))
		eal_argv[eal_argc++] = "--no-shconf";
	if (!has_opt(user_eal, argv + 1, pci_opts))
		eal_argv[eal_argc++] = "--no-pci";
	if (!has_opt(user_eal, argv + 1, tele_opts))
		eal_argv[eal_argc++] = "--no-telemetry";
	if (!has_opt(user_eal, argv + 1, log_opts))
		eal_argv[eal_argc++] = "--log-level=error";
	if (eal_argc + user_eal >= EAL_ARGS_MAX) {
		fprintf(stderr, "too many EAL arguments\n");
		return 2;
	}
	for (int i = 0; i < user_eal; i++) {
		eal_argv[eal_argc++] = argv[1 + i];
		/* Put kvp on the CPUs the rte_ring lcores will use. */
		if (strcmp(argv[1 + i], "-l") == 0 && i + 1 < user_eal &&
		    !corelist_first_two(argv[2 + i], cpu)) {
			fprintf(stderr, "-l %s: need two CPUs as N,M or N-M\n", argv[2 + i]);
			return 2;
		}
	}
	eal_argv[eal_argc] = NULL;

	runs = mmap(NULL, sizeof(*runs) * REP_MAX, PROT_READ | PROT_WRITE,
		    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (runs == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	for (unsigned int r = 0; r < repeat; r++) {
		runs[r].mops[KVP_SINGLE] = kvp_run(count, 1, cpu[0], cpu[1]);
		runs[r].mops[KVP_BURST] = kvp_run(count, BURST, cpu[0], cpu[1]);
		if (runs[r].mops[KVP_SINGLE] < 0 || runs[r].mops[KVP_BURST] < 0 ||
		    rte_rep(eal_argc, eal_argv, count, runs[r].mops) != 0)
			return 1;
		/* kvp against the rte_ring case of the same burst size, same repetition. */
		for (int c = RTE_PTR_SINGLE; c < CASE_MAX; c++)
			ratio[c][r] = runs[r].mops[cases[c].burst == 1 ? KVP_SINGLE : KVP_BURST] /
				      runs[r].mops[c];
	}
	for (int c = 0; c < CASE_MAX; c++) {
		double v[REP_MAX];

		for (unsigned int r = 0; r < repeat; r++)
			v[r] = runs[r].mops[c];
		qsort(v, repeat, sizeof(v[0]), cmp_double);
		best[c] = v[repeat - 1];
		median[c] = v[repeat / 2];
		if (c >= RTE_PTR_SINGLE) {
			qsort(ratio[c], repeat, sizeof(ratio[c][0]), cmp_double);
			kvp_ratio[c] = ratio[c][repeat / 2];
		}
	}

	if (json) {
		printf("{\"count\":%" PRIu64 ",\"repeat\":%u,\"ring_size\":%d,\"cpus\":[%d,%d],",
		       count, repeat, RING_SIZE, cpu[0], cpu[1]);
		printf("\"mops_median\":{");
		for (int c = 0; c < CASE_MAX; c++)
			printf("%s\"%s\":%.3f", c ? "," : "", cases[c].key, median[c]);
		printf("},\"mops_best\":{");
		for (int c = 0; c < CASE_MAX; c++)
			printf("%s\"%s\":%.3f", c ? "," : "", cases[c].key, best[c]);
		printf("},\"kvp_ratio\":{");
		for (int c = RTE_PTR_SINGLE; c < CASE_MAX; c++)
			printf("%s\"%s\":%.3f", c != RTE_PTR_SINGLE ? "," : "", cases[c].key,
			       kvp_ratio[c]);
		printf("}}\n");
		return 0;
	}
	printf("kvp-ring-bench: %" PRIu64 " entries per run, %u repetitions, ring %d, "
	       "consumer CPU %d, producer CPU %d\n"
	       "kvp/this: median over repetitions of kvp / this case, same burst size\n\n",
	       count, repeat, RING_SIZE, cpu[0], cpu[1]);
	printf("%-24s %6s %9s %9s %9s\n", "case", "entry", "median", "best", "kvp/this");
	printf("%-24s %6s %9s %9s\n", "", "", "Mops/s", "Mops/s");
	for (int c = 0; c < CASE_MAX; c++) {
		printf("%-24s %4u B %9.2f %9.2f", cases[c].label, cases[c].esize, median[c],
		       best[c]);
		if (c >= RTE_PTR_SINGLE)
			printf(" %8.2fx%s", kvp_ratio[c], cases[c].elem ? "  like-for-like" : "");
		printf("\n");
	}
	return 0;
}
