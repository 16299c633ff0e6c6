/* options.c - the run-time options (see options.h): their defaults, the parsing of the SHARDMM_
 * variables the port hands over, the warnings of SHARDMM_VERBOSE and what runs at exit.
 *
 * The port calls back once per SHARDMM_ entry of the environment ("SHARDMM_NAME=value"). A value is
 * either a flag (0 or 1) or a decimal number (digits only, up to the option's maximum); anything else is
 * invalid and the option keeps its default. The entries are read twice: first for their values, then,
 * once SHARDMM_VERBOSE is known (it may come after the others), for the warnings: an unknown SHARDMM_
 * name, an invalid value. Nothing here allocates: the text goes out through libc.h's text_out, a line at
 * a time, to the port's error channel.
 *
 * At exit (port_caps.process_exit_hook, asked for only when SHARDMM_SHOW_STATS or SHARDMM_REPORT_LEAKS
 * is set): the statistics table, then the leak report, both report.c's, neither allocating.
 *
 * Depends on: options.h, libc.h (text_out), port.h (port_caps), include/shardmm.h (the two reports).
 */
#include "options.h"

#include "../include/shardmm.h"
#include "../port/port.h"
#include "libc.h"
#if SHARD_FULL_DEBUG
#include "debugmode.h"
#endif

options options_values = {
    .decommit_delay_ms = SHARD_DECOMMIT_DELAY_MS,
    .reserve_delay_ms = SHARD_RESERVE_DELAY_MS,
    .large_cache_delay_ms = SHARD_LARGE_CACHE_DELAY_MS,
    .large_cache_bytes = SHARD_LARGE_CACHE_BYTES,
    .large_spares = 1,
    .large_colours = 1,
    .earned_tails = 1,
    .lend_pages = 1,
    .huge_pages = SHARD_HUGE_PAGES,
    .quarantine_bytes = SHARD_QUARANTINE_BYTES,
};

#define MB_SHIFT 20
/* The largest cache: 64 TB, more than any address space we map (large.c's LARGE_SIZE_MAX), so that no
 * sum of the cache's bytes wraps. */
#define LARGE_CACHE_MB_MAX ((uint64_t)1 << 26)

static void set_verbose(uint64_t v) { options_values.verbose = (uint32_t)v; }
static void set_show_stats(uint64_t v) { options_values.show_stats = (uint32_t)v; }
static void set_report_leaks(uint64_t v) { options_values.report_leaks = (uint32_t)v; }
static void set_delay(uint64_t v)
{
    options_values.decommit_delay_ms = options_values.reserve_delay_ms = options_values.large_cache_delay_ms = (uint32_t)v;
}
static void set_large_cache(uint64_t v)
{
    options_values.large_cache_bytes = (size_t)v << MB_SHIFT;
    options_values.large_cache_fixed = 1;
}
static void set_large_spares(uint64_t v) { options_values.large_spares = (uint32_t)v; }
static void set_large_colours(uint64_t v) { options_values.large_colours = (uint32_t)v; }
static void set_earned_tails(uint64_t v) { options_values.earned_tails = (uint32_t)v; }
static void set_lend_pages(uint64_t v) { options_values.lend_pages = (uint32_t)v; }
static void set_quarantine(uint64_t v) { options_values.quarantine_bytes = (size_t)v << MB_SHIFT; }
static void set_huge_pages(uint64_t v) { options_values.huge_pages = (uint32_t)v; }

/* The options, by their names after the prefix. */
static const struct spec {
    const char *name;
    uint64_t max;          /* the largest valid value; 1: a flag */
    void (*set)(uint64_t value);
    const char *expected;  /* for the warning about an invalid value */
} specs[] = {
    {"SHOW_STATS", 1, set_show_stats, "0 or 1"},
    {"REPORT_LEAKS", 1, set_report_leaks, "0 or 1"},
    {"VERBOSE", 1, set_verbose, "0 or 1"},
    {"DELAY_MS", UINT32_MAX, set_delay, "a decimal number of milliseconds up to 4294967295"},
    {"LARGE_CACHE_MB", LARGE_CACHE_MB_MAX, set_large_cache, "a decimal number of megabytes up to 67108864"},
    {"LARGE_SPARES", 1, set_large_spares, "0 or 1"},
    {"LARGE_COLOURS", 1, set_large_colours, "0 or 1"},
    {"EARNED_TAILS", 1, set_earned_tails, "0 or 1"},
    {"LEND_PAGES", 1, set_lend_pages, "0 or 1"},
    {"QUARANTINE_MB", LARGE_CACHE_MB_MAX, set_quarantine, "a decimal number of megabytes up to 67108864"},
    {"HUGE_PAGES", SHARD_HUGE_PAGES_ALL, set_huge_pages, "0, 1 or 2"},
};
#define SPECS (sizeof specs / sizeof specs[0])

/* An entry cut into its name (after the prefix) and its value. */
typedef struct entry {
    const char *name, *value;
    size_t name_len, value_len;
    int has_value; /* there was an '=' */
} entry;

static entry split(const char *text, size_t len)
{
    static const char prefix[] = PORT_OPTION_PREFIX;
    size_t skip = sizeof prefix - 1, eq = skip;
    while (eq < len && text[eq] != '=')
        eq++;
    entry e = {text + skip, text + eq, eq - skip, 0, eq < len};
    if (e.has_value) {
        e.value++;
        e.value_len = len - eq - 1;
    }
    return e;
}

static const struct spec *find(const entry *e)
{
    for (size_t i = 0; i < SPECS; i++) {
        size_t k = 0;
        while (k < e->name_len && specs[i].name[k] == e->name[k])
            k++;
        if (k == e->name_len && specs[i].name[k] == 0)
            return &specs[i];
    }
    return NULL;
}

/* The value as a decimal number up to max; 0 when it is not one. */
static int parse(const entry *e, uint64_t max, uint64_t *out)
{
    if (!e->has_value || e->value_len == 0)
        return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < e->value_len; i++) {
        char c = e->value[i];
        if (c < '0' || c > '9')
            return 0;
        v = v * 10 + (uint64_t)(c - '0');
        if (v > max)
            return 0;
    }
    *out = v;
    return 1;
}

/* Pass 1: the values. */
static void take_value(void *arg, const char *text, size_t len)
{
    (void)arg;
    entry e = split(text, len);
    const struct spec *s = find(&e);
    uint64_t v;
    if (s != NULL && parse(&e, s->max, &v))
        s->set(v);
}

/* The entry as given, at most 80 bytes of it. */
static void out_entry(text_out *o, const char *text, size_t len)
{
    char c[2] = {0, 0};
    for (size_t i = 0; i < len && i < 80; i++) {
        c[0] = text[i] >= 32 && text[i] < 127 ? text[i] : '?';
        out_str(o, c);
    }
    if (len > 80)
        out_str(o, "...");
}

/* Pass 2, with SHARDMM_VERBOSE: the warnings. */
static void warn(void *arg, const char *text, size_t len)
{
    (void)arg;
    entry e = split(text, len);
    const struct spec *s = find(&e);
    uint64_t v;
    if (s != NULL && parse(&e, s->max, &v))
        return;
    text_out o;
    out_init(&o, NULL, NULL);
    if (s == NULL) {
        out_str(&o, "shardmm: unknown option ");
        out_entry(&o, text, e.has_value ? (size_t)(e.value - 1 - text) : len);
        out_str(&o, ", ignored\n");
        return;
    }
    out_str(&o, "shardmm: ");
    out_entry(&o, text, len);
    out_str(&o, ": expected ");
    out_str(&o, s->expected);
    out_str(&o, "; the default stays\n");
}

static void at_exit(void)
{
#if SHARD_FULL_DEBUG
    debugmode_at_exit();
#endif
    if (options_values.show_stats)
        shard_print_stats(NULL, NULL);
    if (options_values.report_leaks)
        shard_report_leaks(NULL, NULL);
}

void options_read(void)
{
    if (port_caps.options == NULL)
        return;
    port_caps.options(take_value, NULL);
    if (options_values.verbose)
        port_caps.options(warn, NULL);
    if (!options_values.show_stats && !options_values.report_leaks && !SHARD_FULL_DEBUG)
        return; /* the full-debug build checks its quarantine at exit */
    if ((port_caps.process_exit_hook == NULL || port_caps.process_exit_hook(at_exit) != 0) && options_values.verbose) {
        text_out o;
        out_init(&o, NULL, NULL);
        out_str(&o, "shardmm: no exit hook here: SHARDMM_SHOW_STATS and SHARDMM_REPORT_LEAKS do nothing at exit\n");
    }
}

void options_say_refused(const char *call, size_t bytes)
{
    text_out o;
    out_init(&o, NULL, NULL);
    out_str(&o, "shardmm: the OS refused to ");
    out_str(&o, call);
    out_str(&o, " ");
    out_bytes(&o, bytes, 0);
    out_str(&o, "\n");
}

void options_say_limit(size_t bytes, size_t limit)
{
    text_out o;
    out_init(&o, NULL, NULL);
    out_str(&o, "shardmm: a commit of ");
    out_bytes(&o, bytes, 0);
    out_str(&o, " refused: past the limit of ");
    out_bytes(&o, limit, 0);
    out_str(&o, " (shard_set_limit)\n");
}

void options_say_error_hook(const char *what, const void *p)
{
    text_out o;
    out_init(&o, NULL, NULL);
    out_str(&o, "shardmm: ");
    out_str(&o, what);
    out_str(&o, " ");
    out_hex(&o, (uintptr_t)p, 0);
    out_str(&o, " (to the error hook)\n");
}
