/* malloc_extras.c - glibc's malloc extras, acting on shardmm: mallinfo2, mallinfo, malloc_trim,
 * malloc_stats, malloc_info and mallopt. port/malloc.c includes it, so the drop-in libshardmm.so (and
 * the single-file build with SHARD_MALLOC_NAMES=1) has them; Linux only. Without them a program that
 * asks gets glibc's, which describe glibc's own heap: empty, since every allocation is shardmm's.
 *
 * Each is built on the public API alone (include/shardmm.h): the figures are shard_get_stats', so they
 * are exact when no other thread allocates or frees meanwhile. The C library is at hand here (stdio for
 * malloc_info, errno), unlike in the core; its stdio may allocate, through malloc, which is ours.
 *
 * mallinfo2 (glibc's meaning -> where the figure comes from). glibc counts its mmapped chunks apart from
 * its arenas; large blocks, reservations of their own, stand in for them, so uordblks + hblkhd is what
 * the program holds, as with glibc:
 *   arena     bytes from the system for the arenas -> committed, less what live large blocks keep
 *   ordblks   free chunks                          -> committed empty medium arenas + cached large blocks
 *   smblks    free fastbin chunks                  -> free small-block pages still committed
 *   hblks     mmapped chunks                       -> live large blocks
 *   hblkhd    bytes in mmapped chunks              -> what live large blocks keep committed, headers too
 *   usmblks   unused in glibc, always 0 (once the  -> committed_peak
 *             high-water mark)
 *   fsmblks   bytes in free fastbin chunks         -> the free small pages' bytes (64 KB each)
 *   uordblks  bytes in use (the arenas)            -> usable bytes of live small and medium blocks
 *   fordblks  free bytes (the arenas)              -> arena - uordblks: free items, free chunks, free
 *                                                     pages, empty arenas, the large-block cache, and
 *                                                     the allocator's own tables and headers
 *   keepcost  releasable top of the heap           -> the free small pages' bytes + the cache's: most of
 *                                                     what malloc_trim gives back
 * mallinfo has the same fields as ints: a figure above INT_MAX is INT_MAX (glibc's wraps).
 *
 * malloc_info writes glibc's XML shape with one heap (shardmm's per-thread heaps are not told apart):
 * <sizes> has one <size> line for the free small pages (from = to = 64 KB) when there are any; "fast" is
 * smblks/fsmblks, "rest" ordblks and the rest of fordblks; <system> current is arena, max
 * committed_peak; <aspace> total is the reserved address space, mprotect the committed memory (both of
 * every kind); the totals after the heap repeat these and add "mmap": hblks and hblkhd. An options
 * argument other than 0 gives -1 with errno EINVAL, as glibc's manual says (glibc 2.36's code returns
 * EINVAL itself and leaves errno alone; either way the result is not 0).
 *
 * mallopt takes glibc's parameters and returns glibc 2.36's results - 1, but 0 for M_MXFAST above its
 * largest fast-bin size (80 * sizeof(size_t) / 4 = 160; a negative value is above, as a size_t), and 1
 * for a parameter it does not know (glibc's manual: "does not generate an error") - and none of them acts:
 *   M_MXFAST          fast bins' largest size: small blocks have fixed size classes, all 43 on the
 *                     fast paths
 *   M_TRIM_THRESHOLD  free top size that triggers a trim: free memory goes back by age (a second), not
 *   M_TOP_PAD           by the size of a top chunk, and there is no brk heap to pad
 *   M_MMAP_THRESHOLD  size from which blocks are mmapped: large blocks start above 1 MB, a constant the
 *   M_MMAP_MAX          size classes and the 4 MB arenas are built around; there is no other way to get
 *                       one, so no count of them to limit
 *   M_CHECK_ACTION    glibc 2.36 ignores it too; a bad pointer goes to shard_set_error_hook's hook
 *   M_PERTURB         fill memory on malloc and free: a store on every fast path (15-27 instructions)
 *                     for a debugging aid
 *   M_ARENA_TEST      when to make more arenas: every thread has a heap of its own, so there is no
 *   M_ARENA_MAX         sharing of arenas to tune
 *
 * malloc_trim(pad) is shard_collect(), and says whether committed memory went down; pad is not used
 * (pages, arenas and cached blocks go back whole; there is no top chunk to leave padding on).
 * malloc_stats writes shard_print_stats' table to standard error (file descriptor 2, after stdio's
 * stderr is flushed), where glibc writes its own.
 */
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>

#define SMALL_PAGE_BYTES ((size_t)64 << 10) /* a small-block page, as shard_stats counts them */
#define GLIBC_MAX_FAST ((size_t)80 * sizeof(size_t) / 4) /* the largest M_MXFAST glibc accepts */

static struct mallinfo2 mallinfo_of(const shard_stats *s)
{
    struct mallinfo2 m;
    m.arena = s->committed - s->live_large_committed;
    m.ordblks = s->medium_arenas_empty - s->medium_arenas_decommitted + s->large_cached;
    m.smblks = s->small_pages_free;
    m.hblks = s->live_large;
    m.hblkhd = s->live_large_committed;
    m.usmblks = s->committed_peak;
    m.fsmblks = s->small_pages_free * SMALL_PAGE_BYTES;
    m.uordblks = s->live_small_bytes + s->live_medium_bytes;
    m.fordblks = m.arena - m.uordblks;
    m.keepcost = m.fsmblks + s->large_cached_bytes;
    return m;
}

EXPORT struct mallinfo2 mallinfo2(void)
{
    shard_stats s;
    shard_get_stats(&s);
    return mallinfo_of(&s);
}

static int saturated(size_t n) { return n > INT_MAX ? INT_MAX : (int)n; }

EXPORT struct mallinfo mallinfo(void)
{
    struct mallinfo2 m = mallinfo2();
    struct mallinfo r;
    r.arena = saturated(m.arena);
    r.ordblks = saturated(m.ordblks);
    r.smblks = saturated(m.smblks);
    r.hblks = saturated(m.hblks);
    r.hblkhd = saturated(m.hblkhd);
    r.usmblks = saturated(m.usmblks);
    r.fsmblks = saturated(m.fsmblks);
    r.uordblks = saturated(m.uordblks);
    r.fordblks = saturated(m.fordblks);
    r.keepcost = saturated(m.keepcost);
    return r;
}

EXPORT int malloc_trim(size_t pad)
{
    (void)pad;
    shard_stats before, after;
    shard_get_stats(&before);
    shard_collect();
    shard_get_stats(&after);
    return after.committed < before.committed;
}

EXPORT void malloc_stats(void)
{
    fflush(stderr);
    shard_print_stats(NULL, NULL);
}

/* The "fast" and "rest" <total> lines, in the heap and after it. */
static void info_totals(FILE *fp, const struct mallinfo2 *m)
{
    fprintf(fp, "<total type=\"fast\" count=\"%zu\" size=\"%zu\"/>\n", m->smblks, m->fsmblks);
    fprintf(fp, "<total type=\"rest\" count=\"%zu\" size=\"%zu\"/>\n", m->ordblks, m->fordblks - m->fsmblks);
}

/* The <system> and <aspace> lines, likewise. */
static void info_system(FILE *fp, const struct mallinfo2 *m, const shard_stats *s)
{
    fprintf(fp, "<system type=\"current\" size=\"%zu\"/>\n", m->arena);
    fprintf(fp, "<system type=\"max\" size=\"%zu\"/>\n", s->committed_peak);
    fprintf(fp, "<aspace type=\"total\" size=\"%zu\"/>\n", s->reserved);
    fprintf(fp, "<aspace type=\"mprotect\" size=\"%zu\"/>\n", s->committed);
}

EXPORT int malloc_info(int options, FILE *fp)
{
    if (options != 0) {
        errno = EINVAL;
        return -1;
    }
    shard_stats s;
    shard_get_stats(&s);
    struct mallinfo2 m = mallinfo_of(&s);
    fputs("<malloc version=\"1\">\n<heap nr=\"0\">\n<sizes>\n", fp);
    if (m.smblks != 0)
        fprintf(fp, "  <size from=\"%zu\" to=\"%zu\" total=\"%zu\" count=\"%zu\"/>\n", SMALL_PAGE_BYTES,
                SMALL_PAGE_BYTES, m.fsmblks, m.smblks);
    fputs("</sizes>\n", fp);
    info_totals(fp, &m);
    info_system(fp, &m, &s);
    fputs("</heap>\n", fp);
    info_totals(fp, &m);
    fprintf(fp, "<total type=\"mmap\" count=\"%zu\" size=\"%zu\"/>\n", m.hblks, m.hblkhd);
    info_system(fp, &m, &s);
    fputs("</malloc>\n", fp);
    return 0;
}

EXPORT int mallopt(int param, int value)
{
    if (param == M_MXFAST)
        return (size_t)value <= GLIBC_MAX_FAST;
    return 1;
}
