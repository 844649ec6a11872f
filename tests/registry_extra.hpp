// The datatype registry_extra.def's line names (force-included with it).
#pragma once
#include <mpi.h>
namespace registry_test {
MPI_Datatype float16_datatype();  // test_registry.cpp
}
