/* observe.h - what the tests of shardmm's own rules observe it through (include after allocator.h;
 * with TEST_SYSTEM_MALLOC only a check_allocator() that checks nothing):
 * - stats_now(): a snapshot of shard_get_stats; check_allocator(): shard_check() is 0;
 * - an error hook that records its calls: recording_hook is installed with shard_set_error_hook,
 *   hook_record holds the number of calls and the last call's error, pointer and argument, hook_reset
 *   clears it, CHECK_HOOK(error, p, what) checks that the last call reached it exactly once with them
 *   (needs harness.h). */
#ifndef TEST_OBSERVE_H
#define TEST_OBSERVE_H
#if SHARD_RULES

#include <string.h>

__attribute__((unused)) static shard_stats stats_now(void)
{
    shard_stats s;
    memset(&s, 0, sizeof s);
    shard_get_stats(&s);
    return s;
}

static struct {
    int calls;
    int error;
    void *ptr;
    void *arg;
} hook_record;

__attribute__((unused)) static void recording_hook(void *arg, int error, void *ptr)
{
    hook_record.calls++;
    hook_record.error = error;
    hook_record.ptr = ptr;
    hook_record.arg = arg;
}

__attribute__((unused)) static void hook_reset(void)
{
    memset(&hook_record, 0, sizeof hook_record);
}

#define CHECK_HOOK(err, p, what)                                                                         \
    CHECKF(hook_record.calls == 1 && hook_record.error == (err) && hook_record.ptr == (void *)(p),       \
           "%s: hook called %d times, error %d (expected %d), pointer %p (expected %p)", (what),         \
           hook_record.calls, hook_record.error, (err), hook_record.ptr, (void *)(p))

#endif /* SHARD_RULES */

/* shard_check() is 0 (under shardmm): the calling thread's heap, the heaps waiting for a thread and the
 * large-block cache are consistent. Needs harness.h. */
__attribute__((unused)) static void check_allocator(const char *where)
{
#if SHARD_RULES
    int problems = shard_check();
    CHECKF(problems == 0, "shard_check() = %d %s", problems, where);
#else
    (void)where;
#endif
}

#endif
