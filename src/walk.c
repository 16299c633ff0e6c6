/* walk.c - shard_visit: the live blocks of the calling thread's heap, of the heaps waiting for a thread
 * and the large blocks.
 *
 * What a walk may look at is decided by who could change it meanwhile. The calling thread's heap changes
 * only by its own hand, but for other threads' frees, which push onto lists of their own (a page's
 * thread_free, an arena's chunks marked pending): the walk reads those as they are at that moment. A
 * waiting heap is taken out of the stack for the walk (heap.c's heap_visit_stack), as a trim takes it,
 * so no new thread starts on it. Large blocks belong to no heap: their map entries are read under a lock
 * that every release of a large block takes to clear its entry (large.c's large_visit). Other running
 * threads' heaps are never walked: their free lists change without any lock, and a walk would read them
 * torn. A thread walks its own (the leak report at exit sees the exiting thread's and the waiting ones).
 * A created heap (engine.c) is walked by its user, as its own: shard_heap_visit.
 *
 * Depends on: shardmm.h (the API), heap.h (the slot and the stack), small.h, medium.h, large.h,
 * segment.h (the visitor), debugmode.h (the public names, API).
 */
#include "../include/shardmm.h"
#include "debugmode.h"
#include "heap.h"
#include "large.h"

_Static_assert((int)VISIT_SMALL == (int)SHARD_BLOCK_SMALL && (int)VISIT_MEDIUM == (int)SHARD_BLOCK_MEDIUM &&
                   (int)VISIT_LARGE == (int)SHARD_BLOCK_LARGE,
               "the core's kinds are the API's");

size_t API(visit)(unsigned scope, shard_visit_fn fn, void *arg)
{
    visitor v = {fn, arg, 0, 0};
    heap_started();
    heap *h = heap_mine();
    if (h != NULL)
        small_flush_gathered(h); /* what it freed is no live block, in any heap (small.c, gathered frees) */
    if ((scope & SHARD_VISIT_THREAD) && h != NULL) {
        small_visit(h, &v);
        if (!v.stop)
            medium_visit(h, &v);
    }
    if ((scope & SHARD_VISIT_WAITING) && !v.stop)
        heap_visit_stack(&v);
    if ((scope & SHARD_VISIT_LARGE) && !v.stop)
        large_visit(&v, NULL);
    return v.count;
}

size_t API(heap_visit)(shard_heap *sh, shard_visit_fn fn, void *arg)
{
    if (sh == NULL)
        return API(visit)(SHARD_VISIT_THREAD, fn, arg); /* the calling thread's heap */
    visitor v = {fn, arg, 0, 0};
    heap *h = (heap *)sh;
    small_visit(h, &v);
    if (!v.stop)
        medium_visit(h, &v);
    if (!v.stop)
        large_visit(&v, h);
    return v.count;
}
