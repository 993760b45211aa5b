/* A freestanding program that runs an op queue under qemu-hexagon (Debian has no Hexagon libc): stdin is a
 * 128-byte header (u32 queue length, u32 arena length), the queue padded to 128 bytes, then the arena (buffer
 * id 0); stdout is the status (u32 status, u32 failed op) and the arena after the run. Syscalls are raw
 * `trap0(#1)` (read 63, write 64, exit 93). */
#include <stdint.h>
#include "kazeia_queue.h"

static uint8_t input[32u << 20] __attribute__((aligned(128)));

static long sys3(long nr, long a, long b, long c)
{
    register long r0 __asm__("r0") = a;
    register long r1 __asm__("r1") = b;
    register long r2 __asm__("r2") = c;
    register long r6 __asm__("r6") = nr;
    __asm__ volatile("trap0(#1)" : "+r"(r0) : "r"(r1), "r"(r2), "r"(r6) : "memory");
    return r0;
}

static void write_all(const uint8_t *p, uint32_t n)
{
    while (n) {
        long w = sys3(64, 1, (long)p, n);
        if (w <= 0)
            sys3(93, 3, 0, 0);
        p += w;
        n -= (uint32_t)w;
    }
}

void _start(void)
{
    uint32_t have = 0;
    for (;;) {
        long r = sys3(63, 0, (long)(input + have), sizeof input - have);
        if (r <= 0)
            break;
        have += (uint32_t)r;
    }
    const uint32_t qlen = ((uint32_t *)input)[0], alen = ((uint32_t *)input)[1];
    const uint32_t qpad = (qlen + 127) / 128 * 128;
    if (have < 128 || (uint64_t)128 + qpad + alen != have)
        sys3(93, 2, 0, 0);
    uint8_t *arena = input + 128 + qpad;
    uint32_t status[2];
    status[0] = (uint32_t)kazeia_queue_run(input + 128, qlen, &arena, &alen, 1, &status[1]);
    write_all((const uint8_t *)status, 8);
    write_all(arena, alen);
    sys3(93, 0, 0, 0);
}
