/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A client can take pages away under the daemon's mapping of its region:
 * no seal short of F_SEAL_WRITE stops a hole being punched in a memfd, and
 * in a hugetlbfs one whose pool is then empty the daemon's next access has
 * no page to fault in. That is SIGBUS, which would take the daemon and
 * every other client down with it. The kernel's own copies (send, recv)
 * just return -EFAULT; the daemon's (small payloads out of a connection's
 * buffer, staging) run as guarded copies: a per-thread jump buffer is armed
 * around the memcpy, the handler jumps back to it, and the caller fails
 * that one transfer; a send the kernel failed with -EFAULT probes its
 * frames' memory the same way to find whose it was. Any other SIGBUS goes to the handler installed before
 * us, or takes the default action.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kvp_guard.h"

#define PROBE_PAGE 4096u

static __thread sigjmp_buf *armed;
static struct sigaction prev;
static bool installed;

static void
on_sigbus(int sig, siginfo_t *si, void *uc)
{
	sigjmp_buf *jb = armed;

	/* A fault (si_code > 0), not a SIGBUS someone sent (kill, tgkill: <= 0). */
	if (jb && si && si->si_code > 0) {
		armed = NULL;
		siglongjmp(*jb, 1); /* SA_NODEFER: SIGBUS is not left blocked */
	}
	if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) {
		prev.sa_sigaction(sig, si, uc);
		return;
	}
	if (!(prev.sa_flags & SA_SIGINFO) && prev.sa_handler != SIG_DFL &&
	    prev.sa_handler != SIG_IGN) {
		prev.sa_handler(sig);
		return;
	}
	/* The default action (a core), for a fault and a sent signal alike. */
	signal(sig, SIG_DFL);
	raise(sig);
}

int
kvp_guard_init(void)
{
	struct sigaction sa;

	if (installed)
		return 0; /* prev must stay the handler before ours */
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &prev) < 0)
		return -errno;
	installed = true;
	return 0;
}

int
kvp_guard_copy(void *dst, const void *src, size_t n)
{
	sigjmp_buf jb;

	if (sigsetjmp(jb, 0)) {
		atomic_signal_fence(memory_order_seq_cst);
		return -EFAULT;
	}
	armed = &jb;
	atomic_signal_fence(memory_order_seq_cst); /* armed before the first access */
	memcpy(dst, src, n);
	atomic_signal_fence(memory_order_seq_cst);
	armed = NULL;
	return 0;
}

int
kvp_guard_probe(const void *p, size_t n)
{
	const volatile uint8_t *b = p;
	sigjmp_buf jb;

	if (n == 0)
		return 0;
	if (sigsetjmp(jb, 0)) {
		atomic_signal_fence(memory_order_seq_cst);
		return -EFAULT;
	}
	armed = &jb;
	atomic_signal_fence(memory_order_seq_cst);
	/* A byte every page's length apart touches every page; the last byte ends it. */
	for (size_t i = 0; i < n; i += PROBE_PAGE)
		(void)b[i];
	(void)b[n - 1];
	atomic_signal_fence(memory_order_seq_cst);
	armed = NULL;
	return 0;
}
