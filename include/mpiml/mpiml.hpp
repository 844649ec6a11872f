// mpiml: MPI tools for data-parallel machine learning (everything but torch).
#pragma once

#include <mpiml/checkpoint.hpp>
#include <mpiml/collectives.hpp>
#include <mpiml/datatype.hpp>
#include <mpiml/error.hpp>
#include <mpiml/failure.hpp>
#include <mpiml/launch.hpp>
#include <mpiml/print.hpp>
#include <mpiml/profile.hpp>
#include <mpiml/report.hpp>
#include <mpiml/session.hpp>
#include <mpiml/shm.hpp>
#include <mpiml/stats.hpp>
#include <mpiml/stop.hpp>
