/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Region table: fixed slots, keys = 48 random bits | slot index, so a key
 * cannot be guessed and lookup is one array index. Workers take a reference
 * per operation; removal marks the slot dead and the main lcore unmaps it
 * once no reference is left. The state is re-checked after taking the
 * reference (seq_cst on both sides), so a worker never uses a mapping that
 * the main lcore has decided to unmap.
 *
 * The slow steps (mapping and populating, GPU import, the transports'
 * registration hooks, unmapping) work on a slot the main lcore has made
 * BUSY: any thread may run them, the main lcore publishes or frees the
 * slot afterwards. The hooks and GPU imports are serialised (the
 * transports and the CUDA driver keep per-process state); mmap and munmap
 * are not.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvp_guard.h"
#include "kvp_region.h"
#include "kvp_log.h"

#define SLOT_BITS 16
#define SLOT_MASK ((1u << SLOT_BITS) - 1)
/*
 * Populating and unmapping go in pieces of this size: each holds the
 * process's mmap lock only that long, so the other threads' mmap/munmap
 * (a client's channel, a reply buffer) wait milliseconds, not the seconds
 * a many-GiB region takes (measured: MAP_POPULATE of 2 GiB held it 1.3 s).
 */
#define MAP_PIECE (32ull << 20)

int
kvp_region_table_init(struct kvp_region_table *t, uint32_t max)
{
	struct kvp_region *slots;

	if (max == 0 || max > SLOT_MASK)
		return -EINVAL;
	slots = calloc(max, sizeof(*slots));
	if (!slots)
		return -ENOMEM;
	/* Every field: a table on the stack must not defer releases to garbage. */
	*t = (struct kvp_region_table){ .size = max, .slots = slots };
	return 0;
}

const struct kvp_region_hooks *kvp_region_hooks;

/* The hooks and GPU imports/releases: one at a time, whichever thread runs them. */
static pthread_mutex_t slow_lock = PTHREAD_MUTEX_INITIALIZER;

void
kvp_region_release(struct kvp_region_table *t, uint32_t slot)
{
	struct kvp_region *r = &t->slots[slot];

	pthread_mutex_lock(&slow_lock);
	if (kvp_region_hooks && r->xp)
		kvp_region_hooks->on_remove(kvp_region_hooks->arg, r, slot);
	r->xp = NULL;
	if ((r->flags & KVP_REGION_F_GPU) && r->cookie)
		kvp_memops->release(r->cookie);
	pthread_mutex_unlock(&slow_lock);
	if (!(r->flags & KVP_REGION_F_GPU) && r->map) {
		/* From the end, piece by piece (see MAP_PIECE). */
		size_t left = r->map_len;

		while (left > MAP_PIECE) {
			left -= MAP_PIECE;
			munmap((uint8_t *)r->map + left, MAP_PIECE);
		}
		munmap(r->map, left);
	}
	r->cookie = NULL;
	r->map = NULL;
	r->base = NULL;
	r->flags = 0;
}

void
kvp_region_free(struct kvp_region_table *t, uint32_t slot)
{
	struct kvp_region *r = &t->slots[slot];

	atomic_store(&r->key, 0);
	atomic_store(&r->state, KVP_REGION_FREE);
}

void
kvp_region_table_defer(struct kvp_region_table *t, void (*defer)(void *arg, uint32_t slot),
		       void *arg)
{
	t->defer = defer;
	t->defer_arg = arg;
}

/*
 * Take @p r out of use (a published region has left the count already):
 * BUSY until its release has run, here or where the table defers it to.
 */
static void
retire_slot(struct kvp_region_table *t, struct kvp_region *r)
{
	uint32_t slot = (uint32_t)(r - t->slots);

	atomic_store(&r->key, 0);
	atomic_store(&r->state, KVP_REGION_BUSY);
	if (t->defer) {
		t->defer(t->defer_arg, slot);
		return;
	}
	kvp_region_release(t, slot);
	kvp_region_free(t, slot);
}

static void
unmap_slot(struct kvp_region_table *t, struct kvp_region *r)
{
	t->used--;
	retire_slot(t, r);
}

void
kvp_region_discard(struct kvp_region_table *t, uint32_t slot)
{
	retire_slot(t, &t->slots[slot]);
}

void
kvp_region_table_fini(struct kvp_region_table *t)
{
	for (uint32_t i = 0; i < t->size; i++) {
		if (atomic_load(&t->slots[i].state) == KVP_REGION_FREE)
			continue;
		/* Whatever was still mapped, or waiting for a release that will not run now. */
		kvp_region_release(t, i);
		kvp_region_free(t, i);
	}
	free(t->slots);
	t->slots = NULL;
}

static uint64_t
random_tag(void)
{
	uint64_t v = 0;

	/* getrandom() of 8 bytes never blocks once the pool is up; retry on EINTR. */
	while (getrandom(&v, sizeof(v), 0) != sizeof(v))
		;
	return v;
}

static struct kvp_region *
free_slot(struct kvp_region_table *t, uint32_t *idx)
{
	for (uint32_t i = 0; i < t->size; i++) {
		if (atomic_load(&t->slots[i].state) == KVP_REGION_FREE) {
			*idx = i;
			return &t->slots[i];
		}
	}
	return NULL;
}

int
kvp_region_reserve(struct kvp_region_table *t, uint32_t owner)
{
	uint32_t i;
	struct kvp_region *r = free_slot(t, &i);

	if (!r)
		return -ENOSPC;
	r->map = NULL;
	r->map_len = 0;
	r->base = NULL;
	r->len = 0;
	r->owner = owner;
	r->flags = 0;
	r->device = -1;
	r->cookie = NULL;
	r->xp = NULL;
	r->fd = -1;
	atomic_store(&r->refs, 0);
	atomic_store(&r->state, KVP_REGION_BUSY);
	return (int)i;
}

/* The transports register the region (a BUSY slot) once, now. */
static void
run_add_hooks(struct kvp_region *r, uint32_t slot)
{
	if (!kvp_region_hooks)
		return;
	pthread_mutex_lock(&slow_lock);
	kvp_region_hooks->on_add(kvp_region_hooks->arg, r, slot);
	pthread_mutex_unlock(&slow_lock);
}

int
kvp_region_map_host(struct kvp_region_table *t, uint32_t slot, int fd, uint64_t off, uint64_t len,
		    uint32_t flags)
{
	struct kvp_region *r = &t->slots[slot];
	long page = sysconf(_SC_PAGESIZE);
	struct stat st;

	if (len == 0 || off + len < off || (flags & ~KVP_REGION_F_STAGE) != KVP_REGION_HOST)
		return -EINVAL;
	if (fstat(fd, &st) < 0 || (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)))
		return -EINVAL;
	/* A file that shrinks under the mapping turns every access into SIGBUS. */
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK))
		return -EPERM;
	/* A mapping past EOF would SIGBUS on the first access: refuse it here. */
	if (S_ISREG(st.st_mode) && off + len > (uint64_t)st.st_size)
		return -EINVAL;
	uint64_t map_off = off & ~((uint64_t)page - 1);
	size_t map_len = (size_t)(off + len - map_off);
	void *m = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)map_off);

	if (m == MAP_FAILED)
		return errno == ENOMEM ? -ENOMEM : -EINVAL;
	/*
	 * Populate now: page faults belong to registration, not to the data
	 * path. In pieces (MAP_PIECE); a kernel without MADV_POPULATE_WRITE
	 * (before 5.14) maps again with MAP_POPULATE instead.
	 */
	for (size_t done = 0; done < map_len; done += MAP_PIECE) {
		size_t n = map_len - done < MAP_PIECE ? map_len - done : MAP_PIECE;

		if (madvise((uint8_t *)m + done, n, MADV_POPULATE_WRITE) == 0)
			continue;
		int e = errno;

		munmap(m, map_len);
		if (e != EINVAL)
			return e == ENOMEM ? -ENOMEM : -EINVAL;
		m = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
			 (off_t)map_off);
		if (m == MAP_FAILED)
			return errno == ENOMEM ? -ENOMEM : -EINVAL;
		break;
	}
	r->map = m;
	r->map_len = map_len;
	r->base = (uint8_t *)m + (off - map_off);
	r->len = len;
	r->flags = flags;
	r->fd = fd;
	r->fd_off = map_off;
	run_add_hooks(r, slot);
	r->fd = -1;
	return 0;
}

int
kvp_region_import_gpu(struct kvp_region_table *t, uint32_t slot, uint32_t kind, int device,
		      int fd, const uint8_t ipc[64], uint64_t offset, uint64_t len, char *why,
		      size_t whylen)
{
	uint64_t dptr = 0;
	void *cookie = NULL;

	pthread_mutex_lock(&slow_lock);
	int rc = kvp_memops->import(kind, device, fd, ipc, offset, len, &dptr, &cookie, why,
				    whylen);
	pthread_mutex_unlock(&slow_lock);
	if (rc < 0)
		return rc;
	kvp_region_set_gpu(t, slot, dptr, len, device, cookie);
	return 0;
}

void
kvp_region_set_gpu(struct kvp_region_table *t, uint32_t slot, uint64_t dptr, uint64_t len,
		   int device, void *cookie)
{
	struct kvp_region *r = &t->slots[slot];

	r->base = (uint8_t *)(uintptr_t)dptr;
	r->len = len;
	r->flags = KVP_REGION_F_GPU | KVP_REGION_F_STAGE;
	r->device = device;
	r->cookie = cookie;
	run_add_hooks(r, slot);
}

void
kvp_region_publish(struct kvp_region_table *t, uint32_t slot, uint64_t *key)
{
	struct kvp_region *r = &t->slots[slot];
	uint64_t k;

	atomic_store(&r->refs, 0);
	do {
		k = (random_tag() << SLOT_BITS) | slot;
	} while (k == 0);
	atomic_store(&r->key, k);
	/* Publish last: a worker that sees ACTIVE sees every field set before. */
	atomic_store(&r->state, KVP_REGION_ACTIVE);
	t->used++;
	*key = k;
}

int
kvp_region_add(struct kvp_region_table *t, uint32_t owner, int fd, uint64_t off, uint64_t len,
	       uint32_t flags, uint64_t *key)
{
	int slot = kvp_region_reserve(t, owner);

	if (slot < 0)
		return slot;
	int rc = kvp_region_map_host(t, (uint32_t)slot, fd, off, len, flags);
	if (rc < 0) {
		kvp_region_free(t, (uint32_t)slot);
		return rc;
	}
	kvp_region_publish(t, (uint32_t)slot, key);
	return 0;
}

int
kvp_region_add_gpu(struct kvp_region_table *t, uint32_t owner, uint64_t dptr, uint64_t len,
		   int device, void *cookie, uint64_t *key)
{
	int slot = kvp_region_reserve(t, owner);

	if (slot < 0)
		return slot;
	kvp_region_set_gpu(t, (uint32_t)slot, dptr, len, device, cookie);
	kvp_region_publish(t, (uint32_t)slot, key);
	return 0;
}

static struct kvp_region *
slot_of(struct kvp_region_table *t, uint64_t key)
{
	uint32_t i = (uint32_t)(key & SLOT_MASK);

	if (key == 0 || i >= t->size)
		return NULL;
	return &t->slots[i];
}

struct kvp_region *
kvp_region_get(struct kvp_region_table *t, uint64_t key)
{
	struct kvp_region *r = slot_of(t, key);

	if (!r || atomic_load(&r->state) != KVP_REGION_ACTIVE || atomic_load(&r->key) != key)
		return NULL;
	atomic_fetch_add(&r->refs, 1);
	/* Re-check after the reference is visible: removal may have raced us. */
	if (atomic_load(&r->state) != KVP_REGION_ACTIVE || atomic_load(&r->key) != key) {
		kvp_region_put(r);
		return NULL;
	}
	return r;
}

int
kvp_region_remove(struct kvp_region_table *t, uint64_t key, uint32_t owner)
{
	struct kvp_region *r = slot_of(t, key);

	if (!r || atomic_load(&r->state) != KVP_REGION_ACTIVE || atomic_load(&r->key) != key ||
	    r->owner != owner)
		return -ENOENT;
	atomic_store(&r->state, KVP_REGION_DEAD);
	if (atomic_load(&r->refs) != 0) {
		/* In use: the client must wait for its transfers to end. */
		atomic_store(&r->state, KVP_REGION_ACTIVE);
		return -EBUSY;
	}
	unmap_slot(t, r);
	return 0;
}

void
kvp_region_remove_owner(struct kvp_region_table *t, uint32_t owner)
{
	for (uint32_t i = 0; i < t->size; i++) {
		struct kvp_region *r = &t->slots[i];

		if (atomic_load(&r->state) == KVP_REGION_ACTIVE && r->owner == owner)
			atomic_store(&r->state, KVP_REGION_DEAD);
	}
	kvp_region_reap(t);
}

unsigned
kvp_region_reap(struct kvp_region_table *t)
{
	unsigned n = 0;

	for (uint32_t i = 0; i < t->size; i++) {
		struct kvp_region *r = &t->slots[i];

		if (atomic_load(&r->state) == KVP_REGION_DEAD && atomic_load(&r->refs) == 0) {
			unmap_slot(t, r);
			n++;
		}
	}
	return n;
}

unsigned
kvp_region_count(const struct kvp_region_table *t, uint32_t owner)
{
	unsigned n = 0;

	for (uint32_t i = 0; i < t->size; i++) {
		const struct kvp_region *r = &t->slots[i];
		uint32_t st = atomic_load((_Atomic uint32_t *)&r->state);

		if (st != KVP_REGION_FREE && r->owner == owner)
			n++;
	}
	return n;
}

static int
host_to_host(void *dst, const struct kvp_region *r, uint64_t off, size_t len)
{
	return kvp_guard_copy(dst, r->base + off, len);
}

static int
host_from_host(const struct kvp_region *r, uint64_t off, const void *src, size_t len)
{
	return kvp_guard_copy(r->base + off, src, len);
}

int
kvp_copy_to_host(void *dst, const struct kvp_region *r, uint64_t off, uint64_t pitch,
		 uint64_t width, uint64_t rows, bool *async)
{
	const struct kvp_memops *m = kvp_memops;
	uint8_t *d = dst;

	if (rows > 1 && pitch != width && m->to_host_2d_async) {
		*async = true;
		return m->to_host_2d_async(dst, r, off, pitch, width, rows);
	}
	if (rows > 1 && pitch == width) {
		width *= rows; /* the rows touch: one copy */
		rows = 1;
	}
	for (uint64_t i = 0; i < rows; i++, d += width, off += pitch) {
		int rc = m->to_host_async ? m->to_host_async(d, r, off, width)
					  : m->to_host(d, r, off, width);

		*async |= m->to_host_async != NULL;
		if (rc < 0)
			return rc;
	}
	return 0;
}

int
kvp_copy_from_host(const struct kvp_region *r, uint64_t off, uint64_t pitch, const void *src,
		   uint64_t width, uint64_t rows)
{
	const struct kvp_memops *m = kvp_memops;
	const uint8_t *s = src;

	if (rows > 1 && pitch != width && m->from_host_2d)
		return m->from_host_2d(r, off, pitch, src, width, rows);
	if (rows > 1 && pitch == width) {
		width *= rows;
		rows = 1;
	}
	for (uint64_t i = 0; i < rows; i++, s += width, off += pitch) {
		int rc = m->from_host(r, off, s, width);

		if (rc < 0)
			return rc;
	}
	return 0;
}

static int
host_register_pool(void *base, size_t len)
{
	(void)base;
	(void)len;
	return 0;
}

static const struct kvp_memops host_memops = {
	.to_host = host_to_host,
	.from_host = host_from_host,
	.register_pool = host_register_pool,
};

char kvp_gpu_unavailable[160] = "GPU memory support not initialised";

const struct kvp_memops *kvp_memops = &host_memops;
