/* Copies into a slot that this CPU will not read again: the consumer reads
 * it, on another core, after the batch is published.
 *
 * A row of a large batch copied with ordinary stores makes the CPU read
 * every destination line first (a read for ownership) and fills the caches
 * with lines nobody here reads again, evicting the source. Non-temporal
 * stores write the lines whole and bypass the caches. glibc's memcpy uses
 * them only for a single copy larger than its threshold (about the size of
 * the last-level cache), which a batch's rows, copied one by one, never
 * are, though together they exceed it many times.
 *
 * Non-temporal stores are weakly ordered: fq_stream_copy ends with a store
 * fence, so the bytes are visible before the worker publishes the slot
 * (a release store, which alone does not order them). Where SSE2 is missing
 * (not x86-64) it is memcpy.
 */
#ifndef FQ_STREAM_H
#define FQ_STREAM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static inline void fq_stream_copy(void *dst, const void *src, size_t n) {
#if defined(__SSE2__)
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > n) head = n;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    for (; i + 16 <= n; i += 16)
        _mm_stream_si128((__m128i *)(d + i),
                         _mm_loadu_si128((const __m128i *)(s + i)));
    memcpy(d + i, s + i, n - i);
    _mm_sfence();
#else
    memcpy(dst, src, n);
#endif
}

#endif /* FQ_STREAM_H */
