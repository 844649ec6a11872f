// GoogleTest main for MPI tests: every rank runs the tests; the job fails on
// every rank if any rank had a failure. Ranks other than 0 print only failures.
#include <mpiml/mpiml.hpp>

#include <gtest/gtest.h>

int main(int argc, char** argv) {
    mpiml::SessionOptions opts;
#ifdef MPIML_TEST_THREAD_MULTIPLE
    opts.thread_level = MPI_THREAD_MULTIPLE;  // tests whose threads call MPI
#endif
    mpiml::Session session(argc, argv, opts);
    if (session.rank() != 0) GTEST_FLAG_SET(brief, true);
    ::testing::InitGoogleTest(&argc, argv);
    int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
    int any_failed = 0;
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_failed && !failed)
        std::fprintf(stderr, "[rank %d] passed here, but another rank failed\n", session.rank());
    return any_failed;
}
