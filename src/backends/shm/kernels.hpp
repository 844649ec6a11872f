// Reduction kernels of the shared-memory path: the slice reduction in fixed
// rank order, cache-line slices, and the copy for large results. The
// element-wise kernels themselves are in kernels.cpp (resolve).
#pragma once

#include <mpiml/collectives.hpp>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace mpiml::detail {

constexpr std::size_t kLine = 64;     // slice alignment, bytes
constexpr std::size_t kBlock = 4096;  // reduction block, bytes (stays in L1)

// MPI_Win_allocate_shared guarantees no alignment (Open MPI's segments can be
// 8 mod 16), so windows are kLine bytes larger and every segment is used
// from its first kLine-aligned byte. Pages map at the same offsets in every
// process, so all ranks agree on the adjustment.
inline char* align_line(void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    return static_cast<char*>(p) + (kLine - a % kLine) % kLine;
}

// out = in[0] op ... op in[p-1] over m elements, in this order, divided by
// divide_by when it is > 1 (floating and complex types).
using CombineFn = void (*)(void* out, const void* const* in, int p, std::size_t m, int divide_by);
using DivideFn = void (*)(void* buf, std::size_t m, int p);

struct Kernel {
    CombineFn combine = nullptr;
    DivideFn divide = nullptr;  // floating and complex types only
    std::size_t tsize = 0;
    int type_id = -1;  // the datatype's registry id (src/types.hpp)
};

// The kernel for a built-in datatype and op; combine == nullptr when unsupported
// (types the registry leaves to MPI, such as MPI_WCHAR, and illegal ops).
Kernel resolve(MPI_Datatype t, Op op);

// outs[0..nout) = the reduction of in[0..p) over m elements, divided by
// divide_by when it is > 1. Outputs may alias inputs: each block is reduced
// into a private buffer first.
inline void reduce_slice(const Kernel& k, const char* const* in, int p, std::size_t m,
                         char* const* outs, int nout, int divide_by) {
    alignas(64) static thread_local char tmp[kBlock];
    static thread_local std::vector<const void*> ptrs;
    ptrs.resize(static_cast<std::size_t>(p));
    const std::size_t per = kBlock / k.tsize;
    for (std::size_t b = 0; b < m; b += per) {
        const std::size_t mb = std::min(per, m - b);
        const std::size_t off = b * k.tsize, nb = mb * k.tsize;
        for (int q = 0; q < p; ++q) ptrs[q] = in[q] + off;
        k.combine(tmp, ptrs.data(), p, mb, divide_by);
        for (int o = 0; o < nout; ++o) std::memcpy(outs[o] + off, tmp, nb);
    }
}

// The same into out1, and into out2 if not null.
inline void reduce_slice(const Kernel& k, const char* const* in, int p, std::size_t m,
                         char* out1, char* out2, int divide_by) {
    char* const outs[2] = {out1, out2};
    reduce_slice(k, in, p, m, outs, out2 ? 2 : 1, divide_by);
}

// m elements split into p slices aligned to cache lines.
struct Slices {
    Slices(std::size_t m_, int p_, std::size_t tsize)
        : m(m_), p(p_), unit(std::max<std::size_t>(1, kLine / tsize)),
          units((m_ + unit - 1) / unit) {}
    std::size_t off(int q) const { return std::min(m, units * q / p * unit); }
    std::size_t len(int q) const { return off(q + 1) - off(q); }
    std::size_t m;
    int p;
    std::size_t unit, units;
};

// Copy for destinations not read again soon (large results): non-temporal
// stores skip reading the destination lines first. Plain memcpy elsewhere.
constexpr std::size_t kStreamMin = std::size_t{1} << 20;
inline void stream_copy(char* dst, const char* src, std::size_t n) {
#if defined(__SSE2__)
    if (n >= kStreamMin) {
        const std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16;
        std::memcpy(dst, src, head);
        dst += head;
        src += head;
        n -= head;
        const std::size_t body = n / 64 * 64;
        for (std::size_t i = 0; i < body; i += 64) {
            const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
            const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
            const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
            _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
            _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
            _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
            _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
        }
        _mm_sfence();  // order the streaming stores before the barrier's flag
        std::memcpy(dst + body, src + body, n - body);
        return;
    }
#endif
    std::memcpy(dst, src, n);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

}  // namespace mpiml::detail
