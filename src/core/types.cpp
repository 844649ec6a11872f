#include "core/types.hpp"

#include <cstring>
#include <vector>

namespace mpiml {
namespace detail {
namespace {

template <class T, TypeClass C>
constexpr char kind_of() {
    if constexpr (std::is_void_v<T>) return 0;
    else if constexpr (C == TypeClass::integer) return std::is_signed_v<T> ? 'i' : 'u';
    else if constexpr (C == TypeClass::floating) return 'f';
    else if constexpr (C == TypeClass::complex) return 'c';
    else if constexpr (C == TypeClass::logical) return 'b';
    else return 0;
}

template <class T>
constexpr std::size_t size_of() {
    if constexpr (std::is_void_v<T>) return 0;
    else return sizeof(T);
}

// Never destroyed: checks and profiles may run inside MPI_Finalize from atexit.
const std::vector<TypeInfo>& registry() {
    static const auto* table = [] {
        auto* t = new std::vector<TypeInfo>;
        auto add = [t]<class T, TypeClass C>(Elem<T, C>, MPI_Datatype type, const char* name) {
            t->push_back({type, name, C, kind_of<T, C>(), size_of<T>(), static_cast<int>(t->size())});
        };
#define MPIML_TYPE(T, DT, CLS, NAME) add(Elem<T, TypeClass::CLS>{}, DT, NAME);
#define MPIML_ALIAS(T, DT, CLS, NAME) add(Elem<T, TypeClass::CLS>{}, DT, NAME);
#define MPIML_OPAQUE(DT, CLS, NAME) add(Elem<void, TypeClass::CLS>{}, DT, NAME);
#include <mpiml/types.def>
        return t;
    }();
    return *table;
}

// find_kind's index: the first entry per kind and size (up to 32 bytes).
constexpr char kinds[] = "iufcb";
constexpr std::size_t max_size = 32;
int kind_slot(char kind, std::size_t size) {
    const char* k = kind ? std::strchr(kinds, kind) : nullptr;
    if (!k || size > max_size) return -1;
    return static_cast<int>((k - kinds) * (max_size + 1) + size);
}

const std::vector<const TypeInfo*>& kind_index() {
    static const auto* index = [] {
        auto* x = new std::vector<const TypeInfo*>((sizeof(kinds) - 1) * (max_size + 1), nullptr);
        for (const TypeInfo& e : registry()) {
            const int slot = kind_slot(e.kind, e.size);
            if (slot >= 0 && !(*x)[static_cast<std::size_t>(slot)]) (*x)[static_cast<std::size_t>(slot)] = &e;
        }
        return x;
    }();
    return *index;
}

}  // namespace

const TypeInfo* find_type(MPI_Datatype type) {
    for (const TypeInfo& e : registry())
        if (e.type == type) return &e;
    return nullptr;
}

const TypeInfo* type_by_id(std::int64_t id) {
    const auto& r = registry();
    return id >= 0 && id < static_cast<std::int64_t>(r.size()) ? &r[static_cast<std::size_t>(id)]
                                                                 : nullptr;
}

const TypeInfo* find_kind(char kind, std::size_t size) {
    const int slot = kind_slot(kind, size);
    return slot < 0 ? nullptr : kind_index()[static_cast<std::size_t>(slot)];
}

const TypeInfo* reduced_in(char kind, std::size_t size) {
    if (const TypeInfo* e = find_kind(kind, size)) return e;
    return wider_than(kind, size);
}

const TypeInfo* wider_than(char kind, std::size_t size) {
    if (kind != 'f' && kind != 'c') return nullptr;
    const TypeInfo* best = nullptr;
    for (const TypeInfo& e : registry())
        if (e.kind == kind && e.size > size && (!best || e.size < best->size)) best = &e;
    return best;
}

std::string kind_name(char kind, std::size_t size) {
    const std::string bits = std::to_string(size * 8);
    switch (kind) {
        case 'b': return "bool";
        case 'i': return "int" + bits;
        case 'u': return "uint" + bits;
        case 'f': return "float" + bits;
        case 'c': return "complex" + bits;
        default: return "opaque";
    }
}

std::string kind_names() {
    std::vector<std::string> seen;
    std::string out;
    for (const TypeInfo& e : registry()) {
        if (e.kind == 0) continue;
        std::string n = kind_name(e.kind, e.size);
        bool dup = false;
        for (const auto& s : seen) dup = dup || s == n;
        if (dup) continue;
        out += (out.empty() ? "" : ", ") + n;
        seen.push_back(std::move(n));
    }
    return out;
}

}  // namespace detail

const char* datatype_name(MPI_Datatype t) {
    const detail::TypeInfo* e = detail::find_type(t);
    return e ? e->name : "MPI datatype";
}

}  // namespace mpiml
