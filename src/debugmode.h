/* debugmode.h - the seam between the core and the full-debug layer (debugmode.c, SHARD_FULL_DEBUG=1).
 *
 * The core's public entry points are written API(name): shard_name in every build but the full-debug
 * one, where they become core_name (hidden, like every internal name) and debugmode.c defines the
 * shard_ names around them. One macro at the definition and at each internal call, rather than a rename
 * of the names themselves, so that the single-file build (src/shardmm.c), where every source shares one
 * translation unit, means the same thing as the library.
 *
 * Depends on: config.h, include/shardmm.h (the types); libc.h for the report helpers.
 */
#ifndef SHARD_DEBUGMODE_H
#define SHARD_DEBUGMODE_H

#include <stddef.h>

#include "../include/shardmm.h"
#include "config.h"
#include "libc.h"

#if SHARD_FULL_DEBUG
#define API(name) core_##name
#else
#define API(name) shard_##name
#endif

#if SHARD_FULL_DEBUG
/* The core's entry points under their core_ names (api.c, engine.c, walk.c): the same contract as the
 * shard_ names of include/shardmm.h. */
void *core_malloc(size_t size);
void *core_calloc(size_t count, size_t size);
void *core_realloc(void *p, size_t size);
void core_free(void *p);
size_t core_usable_size(const void *p);
void *core_malloc_aligned(size_t size, size_t align);
void *core_realloc_aligned(void *p, size_t size, size_t align);
void *core_reallocarray(void *p, size_t count, size_t size);
int core_posix_memalign(void **out, size_t align, size_t size);
void *core_memalign(size_t align, size_t size);
void *core_aligned_alloc(size_t align, size_t size);
void *core_valloc(size_t size);
void *core_pvalloc(size_t size);
int core_check(void);
void core_heap_destroy(shard_heap *heap);
void core_heap_reset(shard_heap *heap);
void *core_heap_malloc(shard_heap *heap, size_t size);
void *core_heap_calloc(shard_heap *heap, size_t count, size_t size);
void *core_heap_realloc(shard_heap *heap, void *p, size_t size);
void *core_heap_malloc_aligned(shard_heap *heap, size_t size, size_t align);
void core_heap_free(shard_heap *heap, void *p);
size_t core_visit(unsigned scope, shard_visit_fn fn, void *arg);
size_t core_heap_visit(shard_heap *heap, shard_visit_fn fn, void *arg);

/* For the leak report (report.c): the allocation site of a live block as shard_visit gives it (NULL when
 * the block has no debug header), and a site written as "0x... (module+0x...)" where the port can
 * symbolize it. */
void *debugmode_alloc_site(const void *block);
void debugmode_out_site(text_out *o, void *site);
/* At exit (options.c): the quarantine checked once more, each damaged block reported. */
void debugmode_at_exit(void);
/* shard_get_stats's live counts and bytes less the quarantined blocks (api.c). */
void debugmode_stats(shard_stats *s);
/* Take (1) or give back (0) the quarantine's lock around a fork (heap.c's fork hooks). */
void debugmode_lock_for_fork(int take);
/* In a fork's child: no thread is inside shard_check (heap.c's fork_child). */
void debugmode_fork_child(void);
#endif

#endif
