/* heap_shim.c - a stand-in for the core's heaps (shard_heap_*, include/shardmm.h) while the core does not
 * implement them yet: TEST-ONLY, compiled only when -DHEAP_SHIM is given (without it this file is empty),
 * and to be deleted when the core lands, with the one line of gen/build.py that names it (in HEAP_SOURCES).
 * The programs that use heaps (tests/test_engines.c, bench/engines.c) link it besides the library.
 *
 * How: every block of a heap is a shard_malloc block with a 48-byte header in front, on a doubly linked
 * list of its heap, so that destroy and reset find and free every block:
 *
 *     base (shard_malloc)        header (48 bytes)                               the caller's block
 *     |  padding (aligned only) | prev | next | heap | size | asked | base |     | size bytes ...
 *
 * The heap's `committed` is a byte count, the sum of what its blocks asked of shard_malloc (header and
 * padding included), not pages as the core counts; the limit bounds that count. An allocation that would
 * pass the limit calls on_limit (if set) and, when it returns non-zero, is tried once more; otherwise it
 * returns NULL and changes nothing. Destroy frees every block and then calls shard_collect(), which gives
 * the freed pages back at once, as the core's destroy returns the heap's memory.
 *
 * What it does not do as the core will: shard_free, shard_realloc and shard_usable_size do not take its
 * blocks (a block starts 48 bytes into a shard_malloc block), so only shard_heap_* may be given them; the
 * blocks come from the calling thread's heap, not from pages of the heap's own; destroy takes time
 * proportional to the blocks. A heap is used by one thread at a time, as the API says; nothing here locks.
 */
#ifdef HEAP_SHIM

#include <stdint.h>
#include <string.h>

#include "shardmm.h"

struct shim_block {             /* the header right before each block */
    struct shim_block *prev, *next;
    shard_heap *heap;           /* the heap the block belongs to */
    size_t size;                /* the caller's size */
    size_t asked;               /* the bytes asked of shard_malloc: what `committed` counts */
    void *base;                 /* the shard_malloc block the header is in */
};
_Static_assert(sizeof(struct shim_block) == 48, "the header keeps blocks 16-byte aligned");

#define SHIM_HEADER sizeof(struct shim_block)
#define SHIM_SMALL_MAX ((size_t)16 << 10)  /* the core's kinds by size, for the statistics */
#define SHIM_MEDIUM_MAX ((size_t)1 << 20)

struct shard_heap {
    struct shim_block list;     /* sentinel of the circular list of live blocks */
    shard_heap_options opt;     /* opt.limit is the limit now (shard_heap_set_limit changes it) */
    size_t committed, committed_peak;
};

static struct shim_block *shim_header(void *p) { return (struct shim_block *)((char *)p - SHIM_HEADER); }
static void *shim_user(struct shim_block *b) { return (char *)b + SHIM_HEADER; }

static int shim_kind(size_t size)
{
    return size <= SHIM_SMALL_MAX ? SHARD_BLOCK_SMALL : size <= SHIM_MEDIUM_MAX ? SHARD_BLOCK_MEDIUM
                                                                                : SHARD_BLOCK_LARGE;
}

static void shim_link(shard_heap *h, struct shim_block *b)
{
    b->heap = h;
    b->prev = &h->list;
    b->next = h->list.next;
    h->list.next->prev = b;
    h->list.next = b;
    h->committed += b->asked;
    if (h->committed > h->committed_peak)
        h->committed_peak = h->committed;
}

static void shim_unlink(struct shim_block *b)
{
    b->prev->next = b->next;
    b->next->prev = b->prev;
    b->heap->committed -= b->asked;
}

static int shim_fits(shard_heap *h, size_t grow)
{
    return h->opt.limit == 0 || (grow <= h->opt.limit && h->committed <= h->opt.limit - grow);
}

/* May committed grow by `grow` bytes for an allocation of `size`? Past the limit on_limit decides. */
static int shim_admit(shard_heap *h, size_t grow, size_t size)
{
    if (shim_fits(h, grow))
        return 1;
    return h->opt.on_limit != NULL && h->opt.on_limit(h->opt.arg, h, size) != 0 && shim_fits(h, grow);
}

shard_heap *shard_heap_create(const shard_heap_options *opt)
{
    shard_heap *h = shard_malloc(sizeof *h);
    if (h == NULL)
        return NULL;
    memset(h, 0, sizeof *h);
    if (opt != NULL)
        h->opt = *opt;
    h->list.prev = h->list.next = &h->list;
    return h;
}

void shard_heap_reset(shard_heap *h)
{
    struct shim_block *b = h->list.next;
    while (b != &h->list) {
        struct shim_block *next = b->next;
        shard_free(b->base);
        b = next;
    }
    h->list.prev = h->list.next = &h->list;
    h->committed = h->committed_peak = 0;
}

void shard_heap_destroy(shard_heap *h)
{
    if (h == NULL)
        return;
    shard_heap_reset(h);
    shard_free(h);
    shard_collect();
}

void *shard_heap_malloc_aligned(shard_heap *h, size_t size, size_t align)
{
    if (align == 0 || (align & (align - 1)) != 0)
        return NULL;
    if (align < 16)
        align = 16;
    size_t pad = align > 16 ? align : 0;
    if (size > SIZE_MAX / 2 - SHIM_HEADER - pad)
        return NULL;
    size_t asked = size + SHIM_HEADER + pad;
    if (!shim_admit(h, asked, size))
        return NULL;
    char *base = shard_malloc(asked);
    if (base == NULL)
        return NULL;
    uintptr_t user = ((uintptr_t)base + SHIM_HEADER + align - 1) & ~(uintptr_t)(align - 1);
    struct shim_block *b = shim_header((void *)user);
    b->size = size;
    b->asked = asked;
    b->base = base;
    shim_link(h, b);
    return (void *)user;
}

void *shard_heap_malloc(shard_heap *h, size_t size) { return shard_heap_malloc_aligned(h, size, 16); }

void *shard_heap_calloc(shard_heap *h, size_t count, size_t size)
{
    if (size != 0 && count > SIZE_MAX / size)
        return NULL;
    void *p = shard_heap_malloc(h, count * size);
    if (p != NULL)
        memset(p, 0, count * size);
    return p;
}

void shard_heap_free(shard_heap *h, void *p)
{
    (void)h; /* a block of another heap goes back to its own */
    if (p == NULL)
        return;
    struct shim_block *b = shim_header(p);
    shim_unlink(b);
    shard_free(b->base);
}

void *shard_heap_realloc(shard_heap *h, void *p, size_t size)
{
    if (p == NULL)
        return shard_heap_malloc(h, size);
    if (size == 0) {
        shard_heap_free(h, p);
        return NULL;
    }
    struct shim_block *b = shim_header(p);
    if (b->heap != h || b->base != (void *)b) { /* another heap's block, or an aligned one: a new block */
        void *q = shard_heap_malloc(h, size);
        if (q != NULL) {
            memcpy(q, p, size < b->size ? size : b->size);
            shard_heap_free(b->heap, p);
        }
        return q;
    }
    if (size > SIZE_MAX / 2 - SHIM_HEADER)
        return NULL;
    size_t asked = size + SHIM_HEADER;
    if (asked > b->asked && !shim_admit(h, asked - b->asked, size))
        return NULL;
    struct shim_block *prev = b->prev, *next = b->next;
    size_t old = b->asked;
    struct shim_block *q = shard_realloc(b, asked);
    if (q == NULL)
        return NULL;
    q->base = q;
    q->size = size;
    q->asked = asked;
    prev->next = next->prev = q; /* the header moved with the contents; its neighbours follow it */
    h->committed = h->committed - old + asked;
    if (h->committed > h->committed_peak)
        h->committed_peak = h->committed;
    return shim_user(q);
}

size_t shard_heap_set_limit(shard_heap *h, size_t limit)
{
    size_t old = h->opt.limit;
    h->opt.limit = limit;
    return old;
}

void shard_heap_get_stats(shard_heap *h, shard_heap_stats *out)
{
    memset(out, 0, sizeof *out);
    out->committed = h->committed;
    out->committed_peak = h->committed_peak;
    out->limit = h->opt.limit;
    for (struct shim_block *b = h->list.next; b != &h->list; b = b->next) {
        switch (shim_kind(b->size)) {
        case SHARD_BLOCK_SMALL:
            out->live_small++;
            out->live_small_bytes += b->size;
            break;
        case SHARD_BLOCK_MEDIUM:
            out->live_medium++;
            out->live_medium_bytes += b->size;
            break;
        default:
            out->live_large++;
            out->live_large_bytes += b->size;
        }
    }
}

#endif /* HEAP_SHIM */
