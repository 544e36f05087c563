/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * kvproxyd: EAL init, configuration, node init, lcore launch, control loop
 * on the main lcore, tear down — the shape of DPDK's l2fwd. EAL options come
 * first, application options after "--". kvproxyd's own options and the
 * configuration are read before the EAL starts, so that --check and --help
 * need neither hugepages nor the EAL, and so that the open-file limit is
 * settled before anything opens files.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_log.h>

#include "kvp_ctrl.h"
#include "kvp_cuda.h"
#include "kvp_gdr.h"
#include "kvp_guard.h"
#include "kvp_tcp_stage.h"
#include "kvproxyd.h"

static volatile sig_atomic_t stop;
static volatile sig_atomic_t dump_stats; /* SIGUSR1: write the stats file now */
static volatile sig_atomic_t reload;	 /* SIGHUP: re-read the configuration file */
static char **eal_argv; /* our copy of argv with --no-pci, freed at exit */

/* What pick_transports() found. */
static struct kvp_gdr_rail rails[KVP_RAILS_MAX];
static struct kvp_gdr_rail_use rails_used[KVP_WIRE_RAILS_MAX];
static int nrails_used;

static void
free_eal_argv(void)
{
	free(eal_argv);
}

static void
on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static void
on_usr1(int sig)
{
	(void)sig;
	dump_stats = 1;
}

static void
on_hup(int sig)
{
	(void)sig;
	reload = 1;
}

static void
usage_to(FILE *f, const char *prog)
{
	fprintf(f,
		"usage: %s [EAL options] -- -c CONFIG [--check]\n"
		"       %s --check -c CONFIG\n"
		"kvproxyd options (after \"--\"; without one, --check makes every argument\n"
		"kvproxyd's):\n"
		"  -c, --config FILE  kvproxyd configuration (libconfig; see kvproxyd(8) and\n"
		"                     the sample kvproxy.conf)\n"
		"      --check        validate the configuration (and say how many open files\n"
		"                     it needs) and exit 0, or 1 with FILE:LINE: reason; the\n"
		"                     EAL is not started, no hugepages are needed\n"
		"  -h, --help         this text (\"kvproxyd --help\" shows the EAL's first)\n"
		"EAL: give at least two lcores (main + one worker), e.g. -l 0,1, or set\n"
		"cores = \"auto\" in the configuration; without hugepages use --no-huge\n"
		"--no-shconf -m 256 (--no-huge --in-memory is refused); two daemons on one\n"
		"host need distinct --file-prefix values (or --no-shconf).\n"
		"Exit status: 0 ok, 1 configuration or start-up error, 2 usage.\n",
		prog, prog);
}

static void
usage(const char *prog)
{
	usage_to(stderr, prog);
}

/* The EAL's --help prints its own options, then calls this. */
static void
usage_hook(const char *prog)
{
	usage_to(stdout, prog);
}

struct app_opts {
	const char *conf;
	bool check;
	bool help;
};

/*
 * kvproxyd's options: after "--", or, with no "--" at all, every argument
 * when one of them is --check (the EAL has no such option), so that
 * "kvproxyd --check -c FILE" works. @return 0, or 2 after a usage message
 */
static int
parse_app(int argc, char **argv, struct app_opts *o)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "check", no_argument, NULL, 'k' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int first = -1, opt, rc = 0;

	memset(o, 0, sizeof(*o));
	for (int i = 1; i < argc && first < 0; i++)
		if (strcmp(argv[i], "--") == 0)
			first = i + 1;
	for (int i = 1; i < argc && first < 0; i++)
		if (strcmp(argv[i], "--check") == 0)
			first = 1;
	if (first < 0)
		return 0; /* EAL arguments only (e.g. --help: the EAL prints ours after its own) */

	/* getopt permutes what it parses: work on a copy, argv[0] first. */
	char **v = calloc((size_t)(argc - first) + 2, sizeof(*v));
	int n = 1;

	if (!v)
		return 2;
	v[0] = argv[0];
	for (int i = first; i < argc; i++)
		v[n++] = argv[i];
	optind = 0; /* glibc: start afresh */
	while ((opt = getopt_long(n, v, "c:h", opts, NULL)) != -1) {
		if (opt == 'c')
			o->conf = optarg;
		else if (opt == 'k')
			o->check = true;
		else if (opt == 'h')
			o->help = true;
		else
			rc = 2;
	}
	if (rc == 0 && optind != n) {
		fprintf(stderr, "kvproxyd: unexpected argument '%s'\n", v[optind]);
		rc = 2;
	}
	optind = 1; /* the EAL parses with getopt too */
	free(v);
	if (rc)
		usage("kvproxyd");
	return rc;
}

/*
 * Pick the transports for this node, in the order each transfer is offered
 * to them (RDMA first where it works; TCP always, as the fallback and the
 * control channel); explain the choice, refuse what cannot work.
 * @return how many, 0 if none can work
 */
static unsigned
pick_transports(const struct kvp_config *cfg, struct kvp_node_env *env)
{
	char why[160];
	int n;

	if (cfg->transport == KVP_TRANSPORT_TCP) {
		snprintf(env->transport_why, sizeof(env->transport_why),
			 "configured (transport = \"tcp\")");
		env->tps[0] = &kvp_tcp_stage_ops;
		return env->ntps = 1;
	}
	n = kvp_gdr_probe(rails, KVP_RAILS_MAX, why, sizeof(why));
	env->rdma_ports = n;
	if (n >= 0)
		n = kvp_gdr_open(cfg, rails_used, why, sizeof(why));
	snprintf(env->rdma_why, sizeof(env->rdma_why), "%s", n < 0 ? why : "");
	if (n > 0) {
		nrails_used = n;
		snprintf(env->transport_why, sizeof(env->transport_why),
			 "transport = \"%s\": %d RDMA rail(s) in use; transfers that cannot go by "
			 "RDMA take the TCP staging path",
			 cfg->transport == KVP_TRANSPORT_AUTO ? "auto" : "rdma", n);
		env->tps[0] = &kvp_rdma_ops;
		env->tps[1] = &kvp_tcp_stage_ops;
		return env->ntps = 2;
	}
	if (cfg->transport == KVP_TRANSPORT_AUTO) {
		snprintf(env->transport_why, sizeof(env->transport_why),
			 "transport = \"auto\" and no usable RDMA: %s", why);
		KVP_LOG(NOTICE, app, "transport auto: using tcp (%s)", env->transport_why);
		env->tps[0] = &kvp_tcp_stage_ops;
		return env->ntps = 1;
	}
	KVP_LOG(ERR, app, "transport rdma: %s", why);
	return 0;
}

/* The RDMA ports found, and which the transport uses as rails (for doctor, rails, stats). */
static void
describe_rails(struct kvp_node_env *env)
{
	for (int i = 0; i < env->rdma_ports && i < KVP_RAILS_MAX; i++) {
		struct kvp_rail_info *r = &env->rails[env->nrails++];

		snprintf(r->dev, sizeof(r->dev), "%.63s", rails[i].dev);
		r->port = rails[i].port;
		r->active = rails[i].state == 4; /* IBV_PORT_ACTIVE */
		r->numa_node = rails[i].numa_node;
		snprintf(r->pci, sizeof(r->pci), "%.31s", rails[i].pci);
		r->rail = -1;
		r->gid_index = -1;
		r->mtu = 128 << rails[i].active_mtu;
		for (int u = 0; u < nrails_used; u++) {
			if (strcmp(rails_used[u].dev, r->dev) == 0 && rails_used[u].port == r->port) {
				r->rail = u;
				r->gid_index = rails_used[u].gid_index;
			}
		}
	}
	if (nrails_used > 0) {
		env->rail_pause = kvp_gdr_rail_pause;
		env->mr_stats = kvp_gdr_mr_stats();
	}
}

/* The GPUs the driver offers; with RDMA, each bound to its nearest rail. */
static void
describe_gpus(struct kvp_node_env *env, int ngpu)
{
	env->cuda_driver = kvp_cuda_driver_version();
	env->ngpus = ngpu;
	for (int i = 0; i < ngpu && i < KVP_GPUS_MAX; i++) {
		struct kvp_cuda_dev g;
		struct kvp_gpu_info *gi = &env->gpus[i];

		if (kvp_cuda_device(i, &g) < 0)
			continue;
		gi->ordinal = i;
		snprintf(gi->name, sizeof(gi->name), "%s", g.name);
		snprintf(gi->pci, sizeof(gi->pci), "%s", g.pci);
		gi->dmabuf = g.dmabuf;
		if (nrails_used > 0)
			kvp_gdr_bind_gpu(i, g.pci);
		gi->gpudirect_rdma = g.gpudirect_rdma;
		gi->total_mem = g.total_mem;
	}
}

/*
 * The worker lcores: every one the EAL was given, or the first cfg->workers
 * of them; each runs a worker (its clients, links, queue pairs, io_uring
 * and staging pool). @return 0, or -EINVAL (said why) when there are fewer
 * than asked for
 */
static int
pick_workers(const struct kvp_config *cfg, struct kvp_node_env *env)
{
	unsigned lc, given = rte_lcore_count() - 1;

	env->nworkers = 0;
	RTE_LCORE_FOREACH_WORKER(lc) {
		if (env->nworkers == KVP_WORKERS_MAX || (cfg->workers && env->nworkers == cfg->workers))
			break;
		env->lcores[env->nworkers++] = lc;
	}
	if (cfg->workers && env->nworkers < cfg->workers) {
		fprintf(stderr,
			"kvproxyd: workers = %u but the EAL has %u worker lcore(s): give it more "
			"(-l/--lcores) or set cores = \"auto\"\n",
			cfg->workers, given);
		env->nworkers = 0;
		return -EINVAL;
	}
	if (given > env->nworkers)
		KVP_LOG(WARNING, app, "%u worker lcores given; running %u (workers = %u)", given,
			env->nworkers, cfg->workers);
	return 0;
}

/*
 * kvproxyd moves data through verbs and sockets, never through DPDK PMDs:
 * unless the user names PCI devices, keep the EAL away from the host's NICs.
 */
static char **
eal_args(int *argc, char **argv)
{
	static char no_pci[] = "--no-pci";
	char **v = calloc((size_t)*argc + 2, sizeof(*v));

	if (!v)
		return argv;
	for (int i = 1; i < *argc && strcmp(argv[i], "--") != 0; i++)
		if (strcmp(argv[i], "-a") == 0 || strncmp(argv[i], "--allow", 7) == 0 ||
		    strcmp(argv[i], "-b") == 0 || strncmp(argv[i], "--block", 7) == 0 ||
		    strcmp(argv[i], "--no-pci") == 0) {
			free(v);
			return argv;
		}
	v[0] = argv[0];
	v[1] = no_pci;
	memcpy(&v[2], &argv[1], sizeof(*v) * (size_t)(*argc - 1));
	(*argc)++;
	return v;
}

int
main(int argc, char **argv)
{
	static struct kvp_node node;
	struct kvp_config cfg;
	struct app_opts app;
	char err[512], fdmsg[512];
	int ret;

	ret = parse_app(argc, argv, &app);
	if (ret)
		return ret;
	if (app.help) {
		usage_to(stdout, "kvproxyd");
		return 0;
	}
	/* With EAL arguments only, --help is the EAL's (ours follows through the hook). */
	bool eal_help = false;

	for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
		eal_help |= strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0;
	if ((!app.conf && !eal_help) || (app.check && !app.conf)) {
		usage("kvproxyd");
		return 2;
	}
	if (app.conf && kvp_config_load(app.conf, &cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	/* Before the EAL: the workers the configuration asks for (EAL lcores may add more). */
	unsigned want_workers = cfg.workers ? cfg.workers : 1;

	if (app.check) {
		uint64_t need = kvp_node_fd_need(&cfg, want_workers);

		/* The limit is the service's, not this shell's: say it, do not fail on it. */
		if (kvp_node_fd_limit(&cfg, want_workers, false, fdmsg, sizeof(fdmsg)) < 0)
			fprintf(stderr, "kvproxyd: warning: %s\n", fdmsg);
		printf("%s: configuration ok (node %s, %u peer(s) of at most %u, listen %s:%u, %s; "
		       "needs up to %" PRIu64 " open files)\n",
		       app.conf, cfg.node_id, cfg.npeers, cfg.max_peers, cfg.listen_host,
		       cfg.listen_port,
		       cfg.auth_secret[0] ? "peers authenticated by secret"
		       : cfg.auth_none	  ? "auth = \"none\": peers NOT authenticated"
					  : "loopback only, no secret",
		       need);
		return 0;
	}
	if (app.conf && kvp_node_fd_limit(&cfg, want_workers, true, fdmsg, sizeof(fdmsg)) < 0) {
		fprintf(stderr, "kvproxyd: %s\n", fdmsg);
		return 1;
	}

	argv = kvp_cores_eal_args(&argc, argv);
	/*
	 * Workers with cores of their own poll without sleeping unless the
	 * file says otherwise: measured, waking a sleeping worker costs 2 to
	 * 20 us per hop of a small transfer. "Of their own" is #17's rule
	 * (4 CPUs for one worker) with one more CPU per further worker.
	 */
	if (kvp_cores_dedicated && !cfg.busy_poll_set) {
		size_t l = strlen(kvp_cores_why);

		cfg.busy_poll = true;
		snprintf(kvp_cores_why + l, sizeof(kvp_cores_why) - l,
			 "; busy polling: each worker has a core of its own (%d CPUs allowed, "
			 "%d wanted) (poll.busy = true; set poll.busy in the file to choose)",
			 kvp_cores_ncpus, kvp_cores_dedicated_min);
	} else if (strncmp(kvp_cores_why, "auto", 4) == 0) {
		size_t l = strlen(kvp_cores_why);

		if (cfg.busy_poll)
			snprintf(kvp_cores_why + l, sizeof(kvp_cores_why) - l,
				 "; busy polling (poll.busy)");
		else
			snprintf(kvp_cores_why + l, sizeof(kvp_cores_why) - l,
				 "; idle back-off after poll.idle_us (%d CPUs allowed, busy polling "
				 "wants %d: the workers + main + 2; or poll.busy = false in the file)",
				 kvp_cores_ncpus, kvp_cores_dedicated_min);
	}
	char **orig_argv = argv;

	argv = eal_args(&argc, argv);
	eal_argv = argv != orig_argv ? argv : NULL;
	atexit(free_eal_argv);
	rte_set_application_usage_hook(usage_hook);
	ret = rte_eal_init(argc, argv);
	if (ret < 0) {
		fprintf(stderr, "kvproxyd: EAL initialisation failed: %s\n", rte_strerror(rte_errno));
		return 1;
	}
	if (!app.conf) {
		/* An EAL --help that did not exit: nothing to run. */
		usage("kvproxyd");
		rte_eal_cleanup();
		return 2;
	}
	kvp_log_init();
	rte_log_set_level_pattern("kvp.*", (uint32_t)cfg.log_level);
	KVP_LOG(INFO, app, "%s", fdmsg);
	if (cfg.auth_none)
		KVP_LOG(WARNING, app,
			"SECURITY WARNING: auth = \"none\": peers connecting to %s:%u are NOT "
			"authenticated; any host that reaches the port can send KV into this "
			"node's regions and receive what its clients send",
			cfg.listen_host, cfg.listen_port);
	else if (!cfg.auth_secret[0] && cfg.accept_unknown)
		KVP_LOG(WARNING, app,
			"SECURITY WARNING: accept_unknown_peers without auth.secret: any local "
			"process that reaches %s:%u can join as a peer under a name of its choosing",
			cfg.listen_host, cfg.listen_port);
	if (rte_lcore_count() < 2) {
		fprintf(stderr, "kvproxyd: needs a main lcore and a worker lcore (e.g. -l 0,1)\n");
		rte_eal_cleanup();
		return 1;
	}
	static struct kvp_node_env env;

	kvp_node_env_init(&env);
	if (pick_transports(&cfg, &env) == 0) {
		rte_eal_cleanup();
		return 1;
	}
	/* Loads the driver only: no context exists until a GPU region arrives. */
	int ngpu = kvp_cuda_init(kvp_gpu_unavailable, sizeof(kvp_gpu_unavailable));
	if (ngpu > 0)
		KVP_LOG(NOTICE, app, "CUDA driver %d, %d GPU(s): GPU regions are staged through "
			"the pinned pool", kvp_cuda_driver_version(), ngpu);
	else
		KVP_LOG(NOTICE, app, "GPU regions will be refused: %s", kvp_gpu_unavailable);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGUSR1, on_usr1);
	signal(SIGHUP, on_hup);
	signal(SIGPIPE, SIG_IGN);
	/* A client's region losing its pages fails that transfer, not the daemon. */
	if (kvp_guard_init() < 0)
		KVP_LOG(WARNING, app, "no SIGBUS handler: %s", strerror(errno));

	describe_rails(&env);
	describe_gpus(&env, ngpu);
	env.cores_why = kvp_cores_why;
	env.config_path = app.conf;
	if (pick_workers(&cfg, &env) < 0 ||
	    kvp_node_fd_limit(&cfg, env.nworkers, true, fdmsg, sizeof(fdmsg)) < 0) {
		if (env.nworkers)
			fprintf(stderr, "kvproxyd: %s\n", fdmsg);
		kvp_gdr_close();
		rte_eal_cleanup();
		return 1;
	}
	if (kvp_node_init(&node, &cfg, &env, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvproxyd: %s\n", err);
		kvp_gdr_close();
		rte_eal_cleanup();
		return 1;
	}
	/* Say at start what doctor would: transport, and lcores not local to the NICs. */
	kvp_node_log_doctor(&node);
	for (unsigned i = 0; i < env.nworkers; i++) {
		ret = rte_eal_remote_launch(kvp_worker_loop, &node.workers[i], env.lcores[i]);
		if (ret < 0) {
			fprintf(stderr, "kvproxyd: cannot launch worker %u on lcore %u\n", i,
				env.lcores[i]);
			kvp_node_stop_workers(&node);
			rte_eal_mp_wait_lcore();
			kvp_node_fini(&node);
			kvp_gdr_close();
			rte_eal_cleanup();
			return 1;
		}
	}
	KVP_LOG(NOTICE, app,
		"node %s ready: clients %s, admin %s, peers on %s:%u, %u peer(s), %u worker(s)",
		cfg.node_id, cfg.client_socket, cfg.admin_socket, cfg.listen_host, cfg.listen_port,
		cfg.npeers, env.nworkers);
	while (!stop) {
		kvp_node_poll(&node, 100);
		if (reload) {
			reload = 0;
			KVP_LOG(NOTICE, app, "SIGHUP: reloading %s", app.conf);
			kvp_node_reload(&node, err, sizeof(err));
		}
		if (dump_stats) {
			dump_stats = 0;
			int rc = kvp_stats_write_file(&node);

			if (rc == -ENOENT)
				KVP_LOG(WARNING, app, "SIGUSR1: no stats.file configured");
			else if (rc == 0)
				KVP_LOG(INFO, app, "SIGUSR1: wrote %s", node.cfg.stats_file);
		}
	}
	KVP_LOG(NOTICE, app, "node %s stopping", cfg.node_id);
	kvp_node_stop_workers(&node);
	rte_eal_mp_wait_lcore();
	kvp_node_fini(&node);
	kvp_gdr_close(); /* after the regions' registrations went with the node */
	rte_eal_cleanup();
	return 0;
}
