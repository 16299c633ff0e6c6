/* test_extras.c - glibc's malloc extras as the drop-in build/libshardmm.so exports them
 * (port/malloc_extras.c): mallinfo2, mallinfo, malloc_trim, malloc_stats, malloc_info and mallopt,
 * acting on shardmm, in a program linked with it.
 *
 * The rules, as this file reads them (README.md, port/malloc_extras.c), from shard_get_stats s:
 *   arena    = s.committed - s.live_large_committed    (all but what live large blocks keep)
 *   ordblks  = committed empty medium arenas + s.large_cached
 *   smblks   = s.small_pages_free                      fsmblks = smblks * 64 KB
 *   hblks    = s.live_large                            hblkhd  = s.live_large_committed
 *   usmblks  = s.committed_peak
 *   uordblks = s.live_small_bytes + s.live_medium_bytes (large blocks are in hblkhd, as glibc's mmapped)
 *   fordblks = arena - uordblks                        keepcost = fsmblks + s.large_cached_bytes
 * mallinfo has the same in ints, each at most INT_MAX. malloc_trim is shard_collect, 1 exactly when the
 * committed bytes went down. malloc_stats writes shard_print_stats's table to standard error.
 * malloc_info writes glibc's XML shape with one heap (every number from shard_get_stats, see
 * expected_xml); options other than 0 give -1 and errno EINVAL. mallopt changes nothing and returns
 * what glibc 2.36's does: 1, but 0 for M_MXFAST above 160 (negative values included).
 *
 * Every comparison is with shard_get_stats taken next to the call with nothing allocated between, and
 * the blocks the tests make are of known usable sizes, filled with a pattern and checked. Under glibc's
 * own functions (the drop-in without them: glibc's act on its own heap, which nobody uses here) the
 * numbers disagree, malloc_trim returns 0, malloc_stats prints glibc's arenas and malloc_info its
 * figures: every test fails, which is how the tests were checked, but mallopt's, whose results are
 * glibc's by design (the first test, which finds each name in libshardmm.so, fails for it).
 *
 * The program calls the functions through volatile pointers, as test_malloc.c does.
 *
 * Linux only. Build: see build.ninja (build/test-extras). Run: build/test-extras [test names]
 */
#define HARNESS_MAIN
#include "harness.h"

#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shardmm.h"
#include "dropin.h"

#define KB ((size_t)1 << 10)
#define MB ((size_t)1 << 20)
#define SMALL_PAGE (64 * KB)   /* a small-block page */
#define LARGE_HEADER ((size_t)32)
#define HUGE_PAGE (2 * MB) /* a fresh large block is committed to a multiple of it, mostly (fresh_commit) */
#define KEEP_FREE_PAGES 16     /* free small pages a thread keeps committed through shard_collect */

static void *(*volatile c_malloc)(size_t) = malloc;
static void (*volatile c_free)(void *) = free;
static struct mallinfo2 (*volatile c_mallinfo2)(void) = mallinfo2;
static int (*volatile c_malloc_trim)(size_t) = malloc_trim;
static void (*volatile c_malloc_stats)(void) = malloc_stats;
static int (*volatile c_malloc_info)(int, FILE *) = malloc_info;
static int (*volatile c_mallopt)(int, int) = mallopt;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static struct mallinfo (*volatile c_mallinfo)(void) = mallinfo;
#pragma GCC diagnostic pop

static shard_stats stats_now(void)
{
    shard_stats s;
    memset(&s, 0, sizeof s);
    shard_get_stats(&s);
    return s;
}

/* mallinfo2 as the rules give it from s. */
static struct mallinfo2 expected_mallinfo2(const shard_stats *s)
{
    struct mallinfo2 m;
    memset(&m, 0, sizeof m);
    m.arena = s->committed - s->live_large_committed;
    m.ordblks = s->medium_arenas_empty - s->medium_arenas_decommitted + s->large_cached;
    m.smblks = s->small_pages_free;
    m.hblks = s->live_large;
    m.hblkhd = s->live_large_committed;
    m.usmblks = s->committed_peak;
    m.fsmblks = s->small_pages_free * SMALL_PAGE;
    m.uordblks = s->live_small_bytes + s->live_medium_bytes;
    m.fordblks = m.arena - m.uordblks;
    m.keepcost = m.fsmblks + s->large_cached_bytes;
    return m;
}

#define MALLINFO_FIELDS(X) \
    X(arena) X(ordblks) X(smblks) X(hblks) X(hblkhd) X(usmblks) X(fsmblks) X(uordblks) X(fordblks) X(keepcost)

/* Every field of got is the rules' from s. */
static void check_mallinfo2(const struct mallinfo2 *got, const shard_stats *s, const char *what)
{
    struct mallinfo2 want = expected_mallinfo2(s);
#define CHECK_FIELD(f)                                                                                       \
    CHECKF(got->f == want.f, "%s: mallinfo2()." #f " = %zu, from shard_get_stats %zu", what, got->f, want.f);
    MALLINFO_FIELDS(CHECK_FIELD)
#undef CHECK_FIELD
}

/* The two statistics agree on everything but the counters of OS calls (equal when nothing happened). */
static int same_stats(const shard_stats *a, const shard_stats *b)
{
    return a->committed == b->committed && a->reserved == b->reserved && a->committed_peak == b->committed_peak &&
           a->live_small_bytes == b->live_small_bytes && a->live_medium_bytes == b->live_medium_bytes &&
           a->live_large_committed == b->live_large_committed && a->live_large == b->live_large &&
           a->small_pages_free == b->small_pages_free && a->large_cached == b->large_cached &&
           a->medium_arenas_empty == b->medium_arenas_empty &&
           a->medium_arenas_decommitted == b->medium_arenas_decommitted;
}

/* mallinfo2 with shard_get_stats just before and after it; 0 when something changed meanwhile. */
static int mallinfo2_beside_stats(struct mallinfo2 *m, shard_stats *s)
{
    shard_stats before = stats_now();
    *m = c_mallinfo2();
    *s = stats_now();
    return same_stats(&before, s);
}

static size_t round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* What a fresh large block of usable size u commits (test_large.c's rules, with SHARDMM_EARNED_TAILS=0 as
 * tests/run runs this file): its need (u and the header, whole pages), up to the next 2 MB boundary when
 * that fills at least a quarter of its last 2 MB. */
static size_t fresh_commit(size_t u)
{
    size_t need = round_up(u + LARGE_HEADER, 4096), end = round_up(need, HUGE_PAGE);
    return end - need > HUGE_PAGE - HUGE_PAGE / 4 ? need : end;
}

/* ---- the names ---- */

/* Each extra resolves to build/libshardmm.so, in the program and for dlsym. */
TEST(the_extras_of_the_program_are_shardmms)
{
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    static const dropin_name names[] = {
        { "mallinfo2", (void *)mallinfo2 }, { "mallinfo", (void *)mallinfo },     { "malloc_trim", (void *)malloc_trim },
        { "malloc_stats", (void *)malloc_stats }, { "malloc_info", (void *)malloc_info }, { "mallopt", (void *)mallopt },
    };
#pragma GCC diagnostic pop
    check_names_are_shardmms(names, sizeof names / sizeof names[0]);
}

/* ---- mallinfo2, mallinfo ---- */

/* mallinfo2 is shard_get_stats in glibc's fields, before, while and after blocks of every kind are live:
 * small and medium ones move uordblks by their usable sizes, large ones hblks by their number and hblkhd
 * by what they commit (fresh, on an empty cache: usable + 32 bytes); freeing them moves everything back
 * but for what stays committed for reuse (free pages, empty arenas, the cache), which fordblks holds. */
TEST(mallinfo2_is_shard_get_stats_in_glibcs_fields_as_blocks_come_and_go)
{
    enum { SMALL = 300, MEDIUM = 12, LARGE = 3, N = SMALL + MEDIUM + LARGE };
    static void *blocks[N];
    static size_t sizes[N];
    struct mallinfo2 m0, m1, m2;
    shard_stats s0, s1, s2;
    c_malloc_trim(0); /* the large-block cache emptied: large blocks below are fresh reservations */
    CHECK(mallinfo2_beside_stats(&m0, &s0));
    check_mallinfo2(&m0, &s0, "before");
    size_t small_medium = 0, large = 0;
    for (size_t i = 0; i < N; i++) {
        sizes[i] = i < SMALL ? 1 + i * 37 % 4000 : i < SMALL + MEDIUM ? 20000 + 70000 * (i - SMALL) : (2 + i % 3) * MB + 5;
        blocks[i] = c_malloc(sizes[i]);
        CHECKF(blocks[i] != NULL, "malloc(%zu)", sizes[i]);
        if (!blocks[i])
            continue;
        fill(blocks[i], sizes[i], 0xe000 + i);
        size_t u = malloc_usable_size(blocks[i]);
        if (i < SMALL + MEDIUM)
            small_medium += u;
        else
            large += fresh_commit(u);
    }
    CHECK(mallinfo2_beside_stats(&m1, &s1));
    check_mallinfo2(&m1, &s1, "with the blocks live");
    CHECKF(m1.uordblks == m0.uordblks + small_medium, "uordblks %zu -> %zu, the small and medium blocks hold %zu",
           m0.uordblks, m1.uordblks, small_medium);
    CHECKF(m1.hblks == m0.hblks + LARGE && m1.hblkhd == m0.hblkhd + large,
           "hblks %zu -> %zu, hblkhd %zu -> %zu; %d large blocks committing %zu bytes", m0.hblks, m1.hblks, m0.hblkhd,
           m1.hblkhd, LARGE, large);
    CHECKF(m1.arena + m1.hblkhd == s1.committed, "arena %zu + hblkhd %zu, committed %zu", m1.arena, m1.hblkhd,
           s1.committed);
    for (size_t i = 0; i < N; i++)
        if (blocks[i]) {
            CHECK_PATTERN(blocks[i], sizes[i], 0xe000 + i, "block");
            c_free(blocks[i]);
        }
    CHECK(mallinfo2_beside_stats(&m2, &s2));
    check_mallinfo2(&m2, &s2, "after the frees");
    CHECKF(m2.uordblks == m0.uordblks && m2.hblks == m0.hblks && m2.hblkhd == m0.hblkhd,
           "after the frees: uordblks %zu, hblks %zu, hblkhd %zu; before %zu, %zu, %zu", m2.uordblks, m2.hblks,
           m2.hblkhd, m0.uordblks, m0.hblks, m0.hblkhd);
    CHECKF(m2.keepcost >= LARGE * 2 * MB, "keepcost %zu after %d large blocks went into the cache", m2.keepcost, LARGE);
    CHECKF(m2.usmblks >= m1.arena + m1.hblkhd, "usmblks %zu below what was committed, %zu", m2.usmblks,
           m1.arena + m1.hblkhd);
}

/* mallinfo is mallinfo2 in ints; a figure above INT_MAX is INT_MAX, not wrapped: a large block of 3 GB
 * (committed, never touched but at its ends) takes hblkhd and usmblks past it. */
TEST(mallinfo_is_mallinfo2_in_ints_saturated_at_int_max)
{
    struct mallinfo2 m2;
    shard_stats s;
    CHECK(mallinfo2_beside_stats(&m2, &s));
    struct mallinfo m = c_mallinfo();
#define CHECK_INT_FIELD(f)                                                                                    \
    CHECKF((size_t)m.f == (m2.f > INT_MAX ? (size_t)INT_MAX : m2.f), "mallinfo()." #f " = %d, mallinfo2 %zu", \
           m.f, m2.f);
    MALLINFO_FIELDS(CHECK_INT_FIELD)
    const size_t huge = (size_t)3 << 30;
    unsigned char *p = c_malloc(huge);
    if (!p) {
        printf("  (no 3 GB block here: the saturation is not checked)\n");
        return;
    }
    fill(p, 4 * KB, 0xe100);
    fill(p + huge - 4 * KB, 4 * KB, 0xe101);
    CHECK(mallinfo2_beside_stats(&m2, &s));
    m = c_mallinfo();
    CHECKF(m2.hblkhd >= huge && m.hblkhd == INT_MAX, "with a 3 GB block: mallinfo2().hblkhd %zu, mallinfo().hblkhd %d",
           m2.hblkhd, m.hblkhd);
    MALLINFO_FIELDS(CHECK_INT_FIELD)
#undef CHECK_INT_FIELD
    CHECK_PATTERN(p, 4 * KB, 0xe100, "first page of the 3 GB block");
    CHECK_PATTERN(p + huge - 4 * KB, 4 * KB, 0xe101, "last page of the 3 GB block");
    c_free(p);
    c_malloc_trim(0);
}

/* ---- malloc_trim ---- */

/* malloc_trim(pad) returns 1 exactly when it gave memory back (committed went down), whatever pad. */
static void check_trim(int expect, const char *what)
{
    shard_stats a = stats_now();
    int r = c_malloc_trim(expect ? 0 : 4096);
    shard_stats b = stats_now();
    CHECKF(r == expect, "%s: malloc_trim returned %d, committed %zu -> %zu", what, r, a.committed, b.committed);
    CHECKF((b.committed < a.committed) == (r == 1), "%s: malloc_trim returned %d, committed %zu -> %zu", what, r,
           a.committed, b.committed);
}

/* Blocks of one size, filled, checked and freed: what malloc_trim is to give back. */
static void churn(size_t count, size_t size, uint64_t seed)
{
    void **b = calloc(count, sizeof *b);
    CHECK(b != NULL);
    if (!b)
        return;
    for (size_t i = 0; i < count; i++) {
        b[i] = c_malloc(size);
        CHECKF(b[i] != NULL, "malloc(%zu)", size);
        if (b[i])
            fill(b[i], size, seed + i);
    }
    for (size_t i = 0; i < count; i++)
        if (b[i]) {
            CHECK_PATTERN(b[i], size, seed + i, "block to be trimmed");
            c_free(b[i]);
        }
    free(b);
}

/* After freed large blocks (in the cache), 40 pages of small blocks (beyond the 16 free pages a thread
 * keeps) and four arenas of medium blocks (empty arenas beyond the most recent), malloc_trim returns 1
 * and gives that memory back; with nothing left to give it returns 0. */
TEST(malloc_trim_returns_1_when_memory_went_back_and_0_when_nothing_is_left)
{
    c_malloc_trim(0);
    check_trim(0, "with nothing to give back");
    churn(8, 2 * MB, 0xe200);
    shard_stats s = stats_now();
    CHECKF(s.large_cached == 8, "8 large blocks freed: %zu cached", s.large_cached);
    check_trim(1, "after 8 large blocks were freed");
    s = stats_now();
    CHECKF(s.large_cached == 0 && s.large_cached_bytes == 0, "after malloc_trim: %zu blocks of %zu bytes cached",
           s.large_cached, s.large_cached_bytes);
    check_trim(0, "again, with the cache empty");

    churn(40 * SMALL_PAGE / 1024, 1024, 0xe300);
    s = stats_now();
    CHECKF(s.small_pages_free > KEEP_FREE_PAGES, "40 pages of small blocks freed: %zu free pages",
           s.small_pages_free);
    check_trim(1, "after 40 pages of small blocks were freed");
    s = stats_now();
    CHECKF(s.small_pages_free <= KEEP_FREE_PAGES, "after malloc_trim: %zu free pages committed",
           s.small_pages_free);
    check_trim(0, "again, with the free pages kept");

    size_t decommitted = stats_now().medium_arenas_decommitted;
    churn(32, 500000, 0xe400);
    check_trim(1, "after four arenas of medium blocks were freed");
    s = stats_now();
    CHECKF(s.medium_arenas_decommitted > decommitted, "after malloc_trim: %zu arenas decommitted, %zu before",
           s.medium_arenas_decommitted, decommitted);
    check_trim(0, "again, with one empty arena kept");
}

/* ---- malloc_stats ---- */

/* malloc_stats writes shard_print_stats's table to standard error (file descriptor 2, redirected to a
 * file here), every section of it. */
TEST(malloc_stats_writes_the_statistics_table_to_standard_error)
{
    static const char *const lines[] = {
        "shardmm statistics\n", "\nmemory\n", "\n  committed ", "\nlive blocks\n", "\n  small (up to 16 KB) ",
        "\nsmall-block pages (64 KB)\n", "\nmedium-block arenas (4 MB)\n", "\nlarge-block cache\n", "\nheaps\n",
        "\noperating system\n",
    };
    static char text[16384];
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f)
        return;
    fflush(stderr);
    int saved = dup(2);
    CHECK(saved >= 0 && dup2(fileno(f), 2) == 2);
    c_malloc_stats();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    CHECKF(strncmp(text, lines[0], strlen(lines[0])) == 0, "malloc_stats wrote first: %.60s", text);
    for (size_t i = 1; i < sizeof lines / sizeof lines[0]; i++)
        CHECKF(strstr(text, lines[i]) != NULL, "malloc_stats wrote no line \"%s\" in:\n%s", lines[i], text);
}

/* ---- malloc_info ---- */

/* The XML the rules give for s: glibc's shape with one heap. */
static void expected_xml(char *out, size_t size, const shard_stats *s)
{
    struct mallinfo2 m = expected_mallinfo2(s);
    char sizes[128] = "";
    if (m.smblks)
        snprintf(sizes, sizeof sizes, "  <size from=\"%zu\" to=\"%zu\" total=\"%zu\" count=\"%zu\"/>\n", SMALL_PAGE,
                 SMALL_PAGE, m.fsmblks, m.smblks);
    char totals[512];
    snprintf(totals, sizeof totals,
             "<total type=\"fast\" count=\"%zu\" size=\"%zu\"/>\n"
             "<total type=\"rest\" count=\"%zu\" size=\"%zu\"/>\n",
             m.smblks, m.fsmblks, m.ordblks, m.fordblks - m.fsmblks);
    char system[512];
    snprintf(system, sizeof system,
             "<system type=\"current\" size=\"%zu\"/>\n"
             "<system type=\"max\" size=\"%zu\"/>\n"
             "<aspace type=\"total\" size=\"%zu\"/>\n"
             "<aspace type=\"mprotect\" size=\"%zu\"/>\n",
             m.arena, s->committed_peak, s->reserved, s->committed);
    snprintf(out, size,
             "<malloc version=\"1\">\n<heap nr=\"0\">\n<sizes>\n%s</sizes>\n%s%s</heap>\n%s"
             "<total type=\"mmap\" count=\"%zu\" size=\"%zu\"/>\n%s</malloc>\n",
             sizes, totals, system, totals, m.hblks, m.hblkhd, system);
}

/* Whether text is one well-formed XML element of elements with attributes (name="digits or a word"),
 * no text but white space between tags; *why says what is wrong otherwise. */
static int well_formed(const char *text, const char **why)
{
    const char *stack[16];
    size_t stack_len[16], depth = 0, roots = 0;
    const char *p = text;
    for (;;) {
        while (*p == ' ' || *p == '\n')
            p++;
        if (*p == 0)
            break;
        if (*p != '<')
            return *why = "text outside a tag", 0;
        int closing = *++p == '/';
        p += closing;
        const char *name = p;
        while (*p >= 'a' && *p <= 'z')
            p++;
        size_t len = (size_t)(p - name);
        if (len == 0)
            return *why = "a tag without a name", 0;
        if (closing) {
            if (depth == 0 || stack_len[depth - 1] != len || strncmp(stack[depth - 1], name, len) != 0)
                return *why = "a closing tag that closes no open element", 0;
            depth--;
            if (*p++ != '>')
                return *why = "a closing tag with more than its name", 0;
            continue;
        }
        if (depth == 0 && roots++ > 0)
            return *why = "more than one root element", 0;
        while (*p == ' ') {
            p++;
            while (*p >= 'a' && *p <= 'z')
                p++;
            if (p[0] != '=' || p[1] != '"')
                return *why = "an attribute without =\"", 0;
            p += 2;
            while ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z'))
                p++;
            if (*p++ != '"')
                return *why = "an attribute value that is not digits or a word", 0;
        }
        if (p[0] == '/' && p[1] == '>') {
            p += 2;
            continue;
        }
        if (*p++ != '>' || depth == 16)
            return *why = "a tag that does not end in > or />", 0;
        stack[depth] = name;
        stack_len[depth++] = len;
    }
    if (depth != 0 || roots != 1)
        return *why = "an element left open, or no element", 0;
    return 1;
}

/* malloc_info(0, fp) writes glibc's XML shape, well formed, with shard_get_stats's numbers (taken before
 * and after it: the call allocates nothing through a stream with a buffer of its own), while blocks of
 * every kind are live and after they are freed; options other than 0 give -1 and errno EINVAL. */
TEST(malloc_info_writes_glibcs_xml_shape_with_shard_get_stats_numbers)
{
    static char io[8192], text[8192], want[8192];
    void *b[3] = { c_malloc(100), c_malloc(100000), c_malloc(3 * MB) };
    for (int i = 0; i < 3; i++) {
        CHECK(b[i] != NULL);
        if (b[i])
            fill(b[i], 100, 0xe500 + (uint64_t)i);
    }
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f)
        return;
    CHECK(setvbuf(f, io, _IOFBF, sizeof io) == 0);
    for (int round = 0; round < 2; round++) {
        const char *when = round == 0 ? "with blocks live" : "after they were freed";
        if (round == 1)
            for (int i = 0; i < 3; i++)
                if (b[i]) {
                    CHECK_PATTERN(b[i], 100, 0xe500 + (uint64_t)i, "block");
                    c_free(b[i]);
                }
        rewind(f);
        shard_stats before = stats_now();
        int r = c_malloc_info(0, f);
        shard_stats after = stats_now();
        fputc(0, f);
        fflush(f);
        rewind(f);
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = 0;
        CHECKF(r == 0, "%s: malloc_info(0, f) = %d", when, r);
        CHECKF(same_stats(&before, &after), "%s: malloc_info changed the statistics", when);
        const char *why = "";
        CHECKF(well_formed(text, &why), "%s: malloc_info's XML is not well formed (%s):\n%s", when, why, text);
        expected_xml(want, sizeof want, &before);
        CHECKF(strcmp(text, want) == 0, "%s: malloc_info wrote\n%s\nthe rules give\n%s", when, text, want);
    }
    rewind(f);
    errno = 0;
    int r = c_malloc_info(1, f);
    CHECKF(r == -1 && errno == EINVAL, "malloc_info(1, f) = %d, errno %d", r, errno);
    CHECKF(ftell(f) == 0, "malloc_info(1, f) wrote %ld bytes", ftell(f));
    fclose(f);
}

/* ---- mallopt ---- */

/* mallopt returns glibc 2.36's results (1, but 0 for M_MXFAST above 160, and 1 for a parameter it does
 * not know) and changes nothing: the statistics stay, and after every parameter was set to what would
 * change glibc most (no fast bins, no mmap, mmap from 0 bytes on, one arena, perturbed memory) blocks
 * are still of the kind their size gives and keep their contents. */
TEST(mallopt_returns_glibcs_results_and_changes_nothing)
{
    static const struct {
        int param, value, result;
    } calls[] = {
        { M_MXFAST, 0, 1 },          { M_MXFAST, 64, 1 },          { M_MXFAST, 160, 1 },
        { M_MXFAST, 161, 0 },        { M_MXFAST, -1, 0 },          { M_TRIM_THRESHOLD, 0, 1 },
        { M_TRIM_THRESHOLD, -1, 1 }, { M_TOP_PAD, 0, 1 },          { M_TOP_PAD, 1 << 20, 1 },
        { M_MMAP_THRESHOLD, 0, 1 },  { M_MMAP_THRESHOLD, 4096, 1 }, { M_MMAP_MAX, 0, 1 },
        { M_CHECK_ACTION, 0, 1 },    { M_CHECK_ACTION, 3, 1 },     { M_PERTURB, 0x55, 1 },
        { M_ARENA_TEST, 0, 1 },      { M_ARENA_TEST, 8, 1 },       { M_ARENA_MAX, 0, 1 },
        { M_ARENA_MAX, 1, 1 },       { 2 /* M_NLBLKS */, 1, 1 },   { 3 /* M_GRAIN */, 1, 1 },
        { 4 /* M_KEEP */, 1, 1 },    { 12345, 0, 1 },              { -100, 7, 1 },
    };
    shard_stats a = stats_now();
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        int r = c_mallopt(calls[i].param, calls[i].value);
        CHECKF(r == calls[i].result, "mallopt(%d, %d) = %d, glibc 2.36 gives %d", calls[i].param, calls[i].value, r,
               calls[i].result);
    }
    shard_stats b = stats_now();
    CHECK(same_stats(&a, &b));
    static const size_t sizes[] = { 24, 100000, 2 * MB };
    for (size_t i = 0; i < 3; i++) {
        shard_stats s0 = stats_now();
        unsigned char *p = c_malloc(sizes[i]);
        shard_stats s1 = stats_now();
        CHECK(p != NULL);
        if (!p)
            continue;
        fill(p, sizes[i], 0xe600 + i);
        CHECKF(s1.live_small == s0.live_small + (i == 0) && s1.live_medium == s0.live_medium + (i == 1) &&
                   s1.live_large == s0.live_large + (i == 2),
               "malloc(%zu) after mallopt: live small/medium/large %zu/%zu/%zu -> %zu/%zu/%zu", sizes[i], s0.live_small,
               s0.live_medium, s0.live_large, s1.live_small, s1.live_medium, s1.live_large);
        CHECK_PATTERN(p, sizes[i], 0xe600 + i, "block made after mallopt");
        c_free(p);
    }
}
