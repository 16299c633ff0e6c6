/* libc.c - message formatting for libc.h: a line built in a stack buffer and written by the port.
 * Depends on: libc.h, port.h (port_write_error, port_abort). */
#include "libc.h"

#include "../port/port.h"

static size_t append(char *buf, size_t at, size_t cap, const char *s)
{
    while (*s && at < cap)
        buf[at++] = *s++;
    return at;
}

static size_t append_hex(char *buf, size_t at, size_t cap, uintptr_t v)
{
    char digits[2 + 16];
    int n = 0;
    do {
        digits[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    at = append(buf, at, cap, "0x");
    while (n > 0 && at < cap)
        buf[at++] = digits[--n];
    return at;
}

static size_t append_dec(char *buf, size_t at, size_t cap, unsigned v)
{
    char digits[10];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n > 0 && at < cap)
        buf[at++] = digits[--n];
    return at;
}

void report_error(const char *what, uintptr_t value)
{
    char line[200];
    size_t n = append(line, 0, sizeof line - 1, "shardmm: ");
    n = append(line, n, sizeof line - 1, what);
    n = append(line, n, sizeof line - 1, " ");
    n = append_hex(line, n, sizeof line - 1, value);
    line[n++] = '\n';
    port_write_error(line, n);
}

_Noreturn void assert_failed(const char *file, int line, const char *reason)
{
    char msg[300];
    size_t n = append(msg, 0, sizeof msg - 1, "shardmm: assertion failed at ");
    n = append(msg, n, sizeof msg - 1, file);
    n = append(msg, n, sizeof msg - 1, ":");
    n = append_dec(msg, n, sizeof msg - 1, (unsigned)line);
    n = append(msg, n, sizeof msg - 1, ": ");
    n = append(msg, n, sizeof msg - 1, reason);
    msg[n++] = '\n';
    port_write_error(msg, n);
    port_abort();
}
