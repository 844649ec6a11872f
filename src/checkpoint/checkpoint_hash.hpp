// XXH64 (xxHash, 64-bit, seed 0): the checksum of checkpoint files.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mpiml::detail {

class Xxh64 {
public:
    void update(const void* data, std::size_t n) {
        const auto* p = static_cast<const unsigned char*>(data);
        total_ += n;
        if (mem_size_ + n < 32) {
            std::memcpy(mem_ + mem_size_, p, n);
            mem_size_ += n;
            return;
        }
        if (mem_size_ > 0) {
            const std::size_t fill = 32 - mem_size_;
            std::memcpy(mem_ + mem_size_, p, fill);
            stripe(mem_);
            p += fill;
            n -= fill;
            mem_size_ = 0;
        }
        while (n >= 32) {
            stripe(p);
            p += 32;
            n -= 32;
        }
        std::memcpy(mem_, p, n);
        mem_size_ = n;
    }

    std::uint64_t digest() const {
        std::uint64_t h;
        if (total_ >= 32) {
            h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
            for (std::uint64_t v : v_) h = (h ^ round(0, v)) * P1 + P4;
        } else {
            h = P5;
        }
        h += total_;
        const unsigned char* p = mem_;
        std::size_t n = mem_size_;
        while (n >= 8) {
            h ^= round(0, read64(p));
            h = rotl(h, 27) * P1 + P4;
            p += 8;
            n -= 8;
        }
        if (n >= 4) {
            h ^= static_cast<std::uint64_t>(read32(p)) * P1;
            h = rotl(h, 23) * P2 + P3;
            p += 4;
            n -= 4;
        }
        while (n > 0) {
            h ^= *p * P5;
            h = rotl(h, 11) * P1;
            ++p;
            --n;
        }
        h ^= h >> 33;
        h *= P2;
        h ^= h >> 29;
        h *= P3;
        h ^= h >> 32;
        return h;
    }

private:
    static constexpr std::uint64_t P1 = 0x9E3779B185EBCA87ull;
    static constexpr std::uint64_t P2 = 0xC2B2AE3D27D4EB4Full;
    static constexpr std::uint64_t P3 = 0x165667B19E3779F9ull;
    static constexpr std::uint64_t P4 = 0x85EBCA77C2B2AE63ull;
    static constexpr std::uint64_t P5 = 0x27D4EB2F165667C5ull;

    static std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
    static std::uint64_t round(std::uint64_t acc, std::uint64_t in) {
        return rotl(acc + in * P2, 31) * P1;
    }
    static std::uint64_t read64(const unsigned char* p) {
        std::uint64_t v;
        std::memcpy(&v, p, 8);
        if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
        return v;
    }
    static std::uint32_t read32(const unsigned char* p) {
        std::uint32_t v;
        std::memcpy(&v, p, 4);
        if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
        return v;
    }
    void stripe(const unsigned char* p) {
        v_[0] = round(v_[0], read64(p));
        v_[1] = round(v_[1], read64(p + 8));
        v_[2] = round(v_[2], read64(p + 16));
        v_[3] = round(v_[3], read64(p + 24));
    }

    std::uint64_t v_[4] = {P1 + P2, P2, 0, 0 - P1};
    unsigned char mem_[32] = {};
    std::size_t mem_size_ = 0;
    std::uint64_t total_ = 0;
};

inline std::uint64_t xxh64(const void* data, std::size_t n) {
    Xxh64 h;
    h.update(data, n);
    return h.digest();
}

}  // namespace mpiml::detail
