/* fast.h - the contract between the fast paths (NASM in asm/fast.asm, or C in api.c) and the rest.
 *
 * shard_malloc, shard_free and shard_realloc each have a fast path for a small block of the calling
 * thread and a slow path for everything else. The slow paths are complete entry points on their own:
 * any argument may be given to them, so a fast path that is not sure jumps there with the arguments in
 * its registers as it got them (a tail jump, no frame).
 *
 * In the default library (SHARD_ASM=1) the NASM versions are shard_malloc/free/realloc and the C ones
 * are built beside them as api_malloc_c/free_c/realloc_c, hidden (internal names never share the public
 * prefix, so a static link exports the API alone): tests/test_asm.c runs both on the same operation
 * sequences and compares results and page state. The pure-C library (SHARD_ASM=0) has the C versions
 * under the public names. asm/fast.asm states the instruction count of each path (bench/instr.py
 * measures them).
 *
 * The fast paths, both languages, step by step (no atomic operation anywhere):
 *   heap  = the slot (Linux: &heap_none when the thread has no heap, an empty heap whose entries all
 *          lead to the shared empty page, so malloc needs no NULL test; Windows: NULL is tested)
 *   malloc(n), n <= 2 KB: page = heap->direct[(n + 15) >> 4]; 2-16 KB: the class table, then
 *          heap->classes[cls].first (NULL tested); if page->free is NULL, page->free =
 *          page->local_free (drained foreign frees) and page->local_free = NULL (both NULL: slow,
 *          api_malloc_dry with the heap and the page unless it is the empty page);
 *          item = page->free; page->free = item->next; page->used++; prefetchw the new page->free.
 *   free(p): seg = p & ~(4 MB - 1); heap->own[(uint32_t)p >> 22] == seg (else slow: not a small block
 *          of ours, or another thread's, or NULL) - one load where the segment map and the owner in
 *          descriptor 0 would take four (heap.h); page = descriptor of p; p at a multiple of the
 *          class size below the carved items, by one multiply and compare (page_has_item in small.h;
 *          else slow, which reports it); page->used - 1, and if that is not
 *          above 0 (the page empties, or was full) + 1 again and slow (the only page of a class
 *          list counts one more in `used`, so emptying it stays fast); push p on page->free
 *          (last in, first out; small.h).
 *          The slow path after the own-segment test is small_free_local_slow(heap, page, p) (small.h),
 *          which needs no second lookup; before it, api_free_slow(p), but for one case (not in the
 *          hardened build): p's page descriptor is heap->gather_page, another heap's page whose frees
 *          this thread gathers (small.c), p an item there by the shared line's test
 *          (small_valid_foreign), and heap->gather_count + 1 below SHARD_GATHER_ITEMS: p goes onto
 *          heap->gather_head's list and the count grows.
 *   realloc(p, n): the same own-segment and item tests; bsize / 4 <= n <= bsize returns p.
 */
#ifndef SHARD_FAST_H
#define SHARD_FAST_H

#include <stddef.h>

void *api_malloc_slow(size_t size);
/* The malloc fast paths' slow path when the page they found (of the calling thread's heap h, not the
 * empty page) has no free item: the class's slow path at once, without finding the heap and the page
 * again; api_malloc_slow when that gives NULL (its second try and errno). */
struct heap;
struct page;
void *api_malloc_dry(size_t size, struct heap *h, struct page *pg);
void api_free_slow(void *p);
void *api_realloc_slow(void *p, size_t size);
/* The usable size of a live block of any kind and thread; 0, after the error hook with `error`, if p is
 * not one (engine.c's realloc reports as shard_realloc does). api_usable: the same without the hook
 * (the full-debug layer's test of a block it is not sure of). Both read nothing through p before p is
 * known to be a block of ours. */
size_t api_usable_or_report(const void *p, int error);
size_t api_usable(const void *p);

#if SHARD_ASM
void *api_malloc_c(size_t size);
void api_free_c(void *p);
void *api_realloc_c(void *p, size_t size);
#endif

#endif
