/* libc.c - message formatting for libc.h: a line built in a stack buffer and written by the port, and
 * the text output of the introspection functions (text_out).
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

/* ---- text_out ---------------------------------------------------------------------------------------- */

static void to_port(void *arg, const char *text, size_t len)
{
    (void)arg;
    port_write_error(text, len);
}

void out_init(text_out *o, void (*fn)(void *arg, const char *text, size_t len), void *arg)
{
    o->fn = fn != NULL ? fn : to_port;
    o->arg = arg;
    o->n = 0;
}

void out_flush(text_out *o)
{
    if (o->n > 0)
        o->fn(o->arg, o->buf, o->n);
    o->n = 0;
}

static void out_char(text_out *o, char c)
{
    o->buf[o->n++] = c;
    if (c == '\n' || o->n == sizeof o->buf)
        out_flush(o);
}

void out_str(text_out *o, const char *s)
{
    while (*s)
        out_char(o, *s++);
}

void out_col(text_out *o, const char *s, size_t width)
{
    size_t n = 0;
    for (; s[n]; n++)
        out_char(o, s[n]);
    for (; n < width; n++)
        out_char(o, ' ');
}

/* v's decimal digits into d (at most 20), last digit first; returns how many. */
static unsigned dec_digits(uint64_t v, char *d)
{
    unsigned n = 0;
    do {
        d[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    return n;
}

void out_dec(text_out *o, uint64_t v, unsigned width)
{
    char d[20];
    unsigned n = dec_digits(v, d);
    for (unsigned i = n; i < width; i++)
        out_char(o, ' ');
    while (n > 0)
        out_char(o, d[--n]);
}

void out_hex(text_out *o, uint64_t v, unsigned digits)
{
    char d[16];
    unsigned n = 0;
    do {
        d[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    out_str(o, "0x");
    for (unsigned i = n; i < digits; i++)
        out_char(o, '0');
    while (n > 0)
        out_char(o, d[--n]);
}

void out_bytes(text_out *o, uint64_t bytes, unsigned width)
{
    static const char *const unit[] = {" B", " KB", " MB", " GB", " TB"};
    char text[24];
    size_t n = 0;
    unsigned u = 0;
    uint64_t scale = 1;
    while (u < 4 && bytes >= scale * 1024)
        scale *= 1024, u++;
    if (u == 0) {
        char d[20];
        unsigned k = dec_digits(bytes, d);
        while (k > 0)
            text[n++] = d[--k];
    } else {
        /* In hundredths of the unit, rounded, then as many decimals as leave 3 significant digits. */
        uint64_t hundredths = (bytes * 100 + scale / 2) / scale;
        unsigned decimals = hundredths >= 10000 ? 0 : hundredths >= 1000 ? 1 : 2;
        uint64_t shown = decimals == 2 ? hundredths : decimals == 1 ? (hundredths + 5) / 10 : (hundredths + 50) / 100;
        char d[20];
        unsigned k = dec_digits(shown, d);
        while (k <= decimals)
            d[k++] = '0';
        while (k > 0) {
            if (k == decimals)
                text[n++] = '.';
            text[n++] = d[--k];
        }
    }
    for (const char *s = unit[u]; *s; s++)
        text[n++] = *s;
    text[n] = 0;
    for (size_t i = n; i < width; i++)
        out_char(o, ' ');
    out_str(o, text);
}
