/* large.h - blocks above 1 MB: a reservation each with headroom, and a cache shared by the process
 * (large.c has the design and its dependencies). Large blocks belong to no thread: any thread frees or
 * resizes them. */
#ifndef SHARD_LARGE_H
#define SHARD_LARGE_H

#include <stddef.h>
#include <stdint.h>

/* A block of size bytes (> 1 MB), zeroed when zero is set; NULL out of memory or for an impossible size. */
void *large_alloc(size_t size, int zero);
/* The same at a multiple of align (any power of two; up to 32 it is large_alloc). */
void *large_alloc_aligned(size_t size, size_t align, int zero);
/* The same for a created heap (NULL: no heap), whose limit counts the block's committed memory. */
struct heap;
void *large_alloc_in(struct heap *owner, size_t size, size_t align, int zero);
/* large_alloc for a smaller block that grows past SHARD_MEDIUM_MAX (realloc), which the copy fills at
 * once: a block that grows, whose last 2 MB needs no probe (large.c: earned tails). */
void *large_alloc_grown(size_t size);
/* Free every live large block of a created heap, as large_free would (its destroy or reset). */
void large_release_owned(struct heap *owner);
/* Whether p is a live large block of that heap. */
int large_owner_is(const void *p, struct heap *owner);
/* Free p if it is a live large block; -1 (and nothing changes) if it is not. */
int large_free(void *p);
/* The usable size of a live block, or 0 if p is not one. */
size_t large_usable(const void *p);
/* Resize a live block to size (> 1 MB) within its reservation: p, or NULL when it must move (or the OS
 * refuses to commit; p is then unchanged). */
void *large_resize_in_place(void *p, size_t size);
/* Move a live block to a new reservation for size bytes, with a grown block's headroom, handing its
 * pages over without a copy where the OS can and copying them elsewhere: the new address, or NULL (p
 * unchanged) when p is not a block or memory runs out. */
void *large_move(void *p, size_t size);
/* Give cached blocks older than the delay back to the OS; one load when the cache is empty. */
void large_cache_expire(void);
/* A reservation of `bytes` is about to be made (a segment, an arena): the cache gives back as much of
 * what it holds over its 128 MB (large.c's file comment). */
void large_cache_shed(size_t bytes);
/* At start-up, once the options are read (heap_start): whether threads may empty their own spares
 * without a locked instruction (large.c, spare_own). */
void large_start(void);
/* A retiring heap's spare (large.c) goes to the cache. */
void large_spare_drain(struct heap *h);
/* Give every cached block, the spares' too, back to the OS now (shard_collect). */
void large_cache_release_all(void);
/* The live blocks, their usable bytes and the memory they keep committed (headers included). */
void large_live_counts(size_t *blocks, size_t *bytes, size_t *committed);
/* Take (1) or give back (0) the cache's lock around a fork (heap.c's fork hooks; held as SPIN_FORK). */
void large_lock_for_fork(int take);
void large_cache_counts(size_t *blocks, size_t *bytes);
/* Report every live large block to v (the visitor type is segment.h's), or only those of the created
 * heap `only`; blocks freed or made meanwhile may be reported or not. v's function must not free a large
 * block (the walk holds a lock their release takes). */
struct visitor;
void large_visit(struct visitor *v, struct heap *only);
/* Problems in the cache (reported through report_error); 0 when it is consistent. */
int large_check(void);

#endif
