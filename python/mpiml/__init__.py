"""mpiml: MPI tools for data-parallel machine learning."""
