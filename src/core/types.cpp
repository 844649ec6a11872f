#include "core/types.hpp"

#include <vector>

namespace mpiml {
namespace detail {
namespace {

// Never destroyed: checks and profiles may run inside MPI_Finalize from atexit.
const std::vector<TypeInfo>& registry() {
    static const auto* table = [] {
        auto* t = new std::vector<TypeInfo>;
        auto add = [t](MPI_Datatype type, const char* name, TypeClass cls, Rep rep) {
            t->push_back({type, name, cls, rep, static_cast<int>(t->size())});
        };
#define MPIML_TYPE(T, DT, CLS, NAME) add(DT, NAME, TypeClass::CLS, rep_of<T>());
#define MPIML_ALIAS(T, DT, CLS, NAME) add(DT, NAME, TypeClass::CLS, rep_of<T>());
#define MPIML_OPAQUE(DT, CLS, NAME) add(DT, NAME, TypeClass::CLS, Rep::none);
#include <mpiml/types.def>
        return t;
    }();
    return *table;
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

}  // namespace detail

const char* datatype_name(MPI_Datatype t) {
    const detail::TypeInfo* e = detail::find_type(t);
    return e ? e->name : "MPI datatype";
}

}  // namespace mpiml
