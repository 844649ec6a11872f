// The registry of element types and ops (<mpiml/types.def>, <mpiml/ops.def>)
// and what every door derives from it. Built twice: as the library is, and
// with one line appended to types.def (MPIML_TYPES_EXTRA: float16), which
// must then appear in C++ (mpi_datatype, the registry, the kernels), in the
// lookup numpy's dtypes go through, and in the LibTorch dtype table.
#include <mpi.h>

#include "backends/shm/kernels.hpp"
#include "core/op.hpp"
#include "core/types.hpp"
#ifdef MPIML_TEST_TORCH
#include "torch/dtypes.hpp"
#endif

#include <mpiml/error.hpp>

#include <gtest/gtest.h>

#include <array>
#include <complex>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

using mpiml::Op;
using mpiml::TypeClass;
using namespace mpiml::detail;

#ifdef MPIML_TYPES_EXTRA
MPI_Datatype registry_test::float16_datatype() {
    static MPI_Datatype t = [] {
        MPI_Datatype d = MPI_DATATYPE_NULL;
        MPI_Type_contiguous(2, MPI_BYTE, &d);
        MPI_Type_commit(&d);
        return d;
    }();
    return t;
}
#endif

namespace mpiml::detail {
// The one library function core/op.cpp calls (ReduceOp on an invalid Op);
// this test builds the registry's sources alone.
void fail(const char* call, const std::string& what) { throw std::runtime_error(std::string(call) + ": " + what); }
}

// ------------------------------------------------------------------ ops

TEST(Registry, EveryOpHasItsNameAndMpiOp) {
    EXPECT_EQ(op_count, std::size(mpiml::all_ops));
    for (Op o : mpiml::all_ops) {
        const OpInfo i = op_info(o);
        ASSERT_NE(i.native, MPI_OP_NULL) << i.name;
        const Op* back = op_by_name(i.name);
        ASSERT_NE(back, nullptr) << i.name;
        EXPECT_EQ(*back, o);
    }
    EXPECT_EQ(op_info(Op::bxor).native, MPI_BXOR);
    EXPECT_EQ(op_by_name("avg"), nullptr);
    EXPECT_EQ(op_names().rfind("sum, prod, min, max, land, lor, lxor, band, bor, bxor", 0), 0u);
}

TEST(Registry, OpClassesAreMpis) {  // MPI 4.0, section 6.9.2
    EXPECT_TRUE(op_allowed(Op::sum, TypeClass::complex));
    EXPECT_FALSE(op_allowed(Op::sum, TypeClass::logical));
    EXPECT_FALSE(op_allowed(Op::min, TypeClass::complex));
    EXPECT_TRUE(op_allowed(Op::lor, TypeClass::logical));
    EXPECT_FALSE(op_allowed(Op::band, TypeClass::logical));
    EXPECT_FALSE(op_allowed(Op::band, TypeClass::floating));
    for (Op o : mpiml::all_ops) {
        EXPECT_FALSE(op_allowed(o, TypeClass::character)) << op_info(o).name;
        EXPECT_TRUE(op_allowed(op_on_bool(o), TypeClass::logical)) << op_info(o).name;
    }
    EXPECT_EQ(op_on_bool(Op::sum), Op::lor);
    EXPECT_EQ(op_on_bool(Op::prod), Op::land);
    EXPECT_EQ(op_on_bool(Op::bxor), Op::lxor);
}

// Every (registry type, op) kernel against MPI's own op on the same values
// (small ones: no overflow, where some MPI libraries go wrong).
template <class T>
void check_kernels_against_mpi(const TypeInfo& e) {
    constexpr int n = 37;
    std::array<T, n> a, b;  // (std::vector<bool> has no data())
    for (int i = 0; i < n; ++i) {
        a[i] = static_cast<T>(i % 4 == 0 ? 0 : 1 + i % 3);
        b[i] = static_cast<T>(i % 5 == 0 ? 0 : 2 + i % 2);
    }
    int checked = 0;
    for (Op o : mpiml::all_ops) {
        const Kernel k = resolve(e.type, o);
        if (!op_allowed(o, e.cls)) {
            EXPECT_EQ(k.combine, nullptr) << e.name << " " << op_info(o).name;
            continue;
        }
        ASSERT_NE(k.combine, nullptr) << e.name << " " << op_info(o).name;
        std::array<T, n> got{}, want = b;
        const void* in[2] = {a.data(), b.data()};
        k.combine(got.data(), in, 2, n, 0);
        ASSERT_EQ(MPI_Reduce_local(a.data(), want.data(), n, e.type, op_info(o).native), MPI_SUCCESS);
        EXPECT_TRUE(got == want) << e.name << " " << op_info(o).name;  // values: long double has padding
        ++checked;
    }
    EXPECT_GT(checked, 0) << e.name;
}

TEST(Registry, KernelsMatchMpiForEveryTypeAndOp) {
    int types = 0;
    for (std::int64_t id = 0; const TypeInfo* e = type_by_id(id); ++id) {
        if (e->kind == 0 || e->type == MPI_DATATYPE_NULL) continue;
        int size = 0;
        MPI_Type_size(e->type, &size);
        if (static_cast<std::size_t>(size) != e->size) continue;  // e.g. a 32-bit wchar_t
#ifdef MPIML_TYPES_EXTRA
        if (std::string(e->name) == "float16") continue;  // MPI cannot reduce it: its own test
#endif
        with_elem<void>(*e, [&]<class E>(E) {
            if constexpr (!std::is_void_v<typename E::type>) check_kernels_against_mpi<typename E::type>(*e);
        });
        ++types;
    }
    EXPECT_GE(types, 20);
}

// ------------------------------------------------------------- element types

TEST(Registry, BoolIsMpiCxxBoolEverywhere) {
    EXPECT_EQ(mpiml::mpi_datatype<bool>(), MPI_CXX_BOOL);
    const TypeInfo* e = find_kind('b', 1);  // numpy's and torch's bool
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->type, MPI_CXX_BOOL);
    EXPECT_EQ(e->cls, TypeClass::logical);
#ifdef MPIML_TEST_TORCH
    EXPECT_EQ(mpiml::torch_detail::torch_dtype(at::kBool)->elem, e);
#endif
}

TEST(Registry, NumpyKindsFindTheirTypes) {  // what python/src/core.cpp looks up
    EXPECT_EQ(find_kind('i', 8)->type, MPI_LONG);
    EXPECT_EQ(find_kind('u', 1)->type, MPI_UNSIGNED_CHAR);
    EXPECT_EQ(find_kind('f', 4)->type, MPI_FLOAT);
    EXPECT_EQ(find_kind('f', sizeof(long double))->type, MPI_LONG_DOUBLE);
    EXPECT_EQ(find_kind('c', 16)->type, MPI_CXX_DOUBLE_COMPLEX);
    EXPECT_EQ(find_kind('V', 4), nullptr);
    EXPECT_EQ(reduced_in('i', 3), nullptr);
    EXPECT_EQ(reduced_in('c', 4)->type, MPI_CXX_FLOAT_COMPLEX);  // complex32 in complex64
    EXPECT_EQ(kind_name('u', 2), "uint16");
}

#ifdef MPIML_TYPES_EXTRA
// The appended line, in every door.
TEST(RegistryExtraLine, Float16AppearsInCxx) {
    EXPECT_EQ(mpiml::mpi_datatype<_Float16>(), registry_test::float16_datatype());
    EXPECT_STREQ(mpiml::mpi_type_traits<_Float16>::name, "float16");
    const TypeInfo* e = find_type(registry_test::float16_datatype());
    ASSERT_NE(e, nullptr);
    EXPECT_STREQ(e->name, "float16");
    EXPECT_EQ(e->cls, TypeClass::floating);
    EXPECT_STREQ(mpiml::datatype_name(e->type), "float16");
    // The shared-memory kernels: float16 sums and maxima in float16.
    const Kernel k = resolve(e->type, Op::sum);
    ASSERT_NE(k.combine, nullptr);
    EXPECT_EQ(k.tsize, 2u);
    auto h = [](float x) { return static_cast<_Float16>(x); };
    _Float16 a[3] = {h(1.5f), h(-2), h(1000)}, b[3] = {h(0.25f), h(0.5f), h(24)};
    _Float16 out[3];
    const void* in[2] = {a, b};
    k.combine(out, in, 2, 3, 0);
    EXPECT_EQ(static_cast<float>(out[0]), 1.75f);
    EXPECT_EQ(static_cast<float>(out[1]), -1.5f);
    EXPECT_EQ(static_cast<float>(out[2]), 1024.0f);
    EXPECT_EQ(resolve(e->type, Op::band).combine, nullptr);  // floating: no bitwise ops
}

TEST(RegistryExtraLine, Float16AppearsInNumpy) {
    // numpy's float16 (kind 'f', 2 bytes) is reduced as itself, no longer in float32.
    const TypeInfo* e = find_kind('f', 2);
    ASSERT_NE(e, nullptr);
    EXPECT_STREQ(e->name, "float16");
    EXPECT_EQ(reduced_in('f', 2), e);
    EXPECT_NE(kind_names().find("float16"), std::string::npos);
}

#ifdef MPIML_TEST_TORCH
TEST(RegistryExtraLine, Float16AppearsInTorch) {
    using mpiml::torch_detail::torch_dtype;
    const auto* half = torch_dtype(at::kHalf);
    ASSERT_NE(half->elem, nullptr);
    EXPECT_STREQ(half->elem->name, "float16");
    EXPECT_EQ(half->reduced_scalar, at::kHalf);  // no longer widened
    const auto* bf16 = torch_dtype(at::kBFloat16);  // another format of the same size
    EXPECT_EQ(bf16->elem, nullptr);
    EXPECT_EQ(bf16->reduced_scalar, at::kFloat);
}
#endif

#else
TEST(Registry, Float16IsWidenedWithoutALineOfItsOwn) {
    EXPECT_EQ(find_kind('f', 2), nullptr);
    EXPECT_EQ(reduced_in('f', 2)->type, MPI_FLOAT);  // numpy's float16 in float32
#ifdef MPIML_TEST_TORCH
    using mpiml::torch_detail::torch_dtype;
    EXPECT_EQ(torch_dtype(at::kHalf)->elem, nullptr);
    EXPECT_EQ(torch_dtype(at::kHalf)->reduced_scalar, at::kFloat);
    EXPECT_EQ(torch_dtype(at::kComplexHalf)->reduced_scalar, at::kComplexFloat);
    EXPECT_EQ(torch_dtype(at::kLong)->elem->type, MPI_LONG);
    EXPECT_EQ(torch_dtype(at::kChar)->elem->type, MPI_SIGNED_CHAR);
    EXPECT_EQ(torch_dtype(at::kFloat)->name, "float32");
    EXPECT_EQ(torch_dtype(at::kBFloat16)->name, "bfloat16");
#endif
}
#endif

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    ::testing::InitGoogleTest(&argc, argv);
    const int rc = RUN_ALL_TESTS();
    MPI_Finalize();
    return rc;
}
