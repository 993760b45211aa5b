/* The few runtime helpers clang calls and Debian has no Hexagon compiler-rt for (the SDK's toolchain provides
 * them on devices): integer division and memset/memcpy. Freestanding qemu builds only. */
#include <stddef.h>
#include <stdint.h>

uint64_t __hexagon_udivdi3(uint64_t n, uint64_t d)
{
    uint64_t q = 0, r = 0;
    for (int i = 63; i >= 0; i--) {
        r = (r << 1) | ((n >> i) & 1);
        if (r >= d) {
            r -= d;
            q |= (uint64_t)1 << i;
        }
    }
    return q;
}

uint64_t __hexagon_umoddi3(uint64_t n, uint64_t d) { return n - __hexagon_udivdi3(n, d) * d; }
uint32_t __hexagon_udivsi3(uint32_t n, uint32_t d) { return (uint32_t)__hexagon_udivdi3(n, d); }
uint32_t __hexagon_umodsi3(uint32_t n, uint32_t d) { return n - __hexagon_udivsi3(n, d) * d; }

int32_t __hexagon_divsi3(int32_t n, int32_t d)
{
    uint32_t q = __hexagon_udivsi3(n < 0 ? -(uint32_t)n : (uint32_t)n, d < 0 ? -(uint32_t)d : (uint32_t)d);
    return (n < 0) != (d < 0) ? -(int32_t)q : (int32_t)q;
}

int32_t __hexagon_modsi3(int32_t n, int32_t d) { return n - __hexagon_divsi3(n, d) * d; }

void *memset(void *p, int c, size_t n)
{
    volatile uint8_t *b = p;
    while (n--)
        *b++ = (uint8_t)c;
    return p;
}

void *memcpy(void *dst, const void *src, size_t n)
{
    volatile uint8_t *d = dst;
    const uint8_t *s = src;
    while (n--)
        *d++ = *s++;
    return dst;
}
