// A stand-in for <mpi.h>, for tests/fuzz/mpi_table_fuzz.cpp only: just the
// names include/gpuverbs/many_peers/rendezvous/mpi.hpp uses, so that the
// header-only MpiRendezvous compiles in the fuzz build without an MPI
// library. The functions are defined by the fuzz target: a pretend world in
// which MPI_Allgather and MPI_Allgatherv bring back what the fuzzer's input
// says the other ranks published. Not an MPI implementation.
#pragma once

using MPI_Comm = int;
using MPI_Datatype = int;

inline constexpr MPI_Comm MPI_COMM_WORLD = 0;
inline constexpr MPI_Datatype MPI_INT = 1;
inline constexpr MPI_Datatype MPI_BYTE = 2;
inline constexpr int MPI_SUCCESS = 0;
inline constexpr int MPI_MAX_ERROR_STRING = 256;

int MPI_Initialized(int* flag);
int MPI_Comm_rank(MPI_Comm comm, int* rank);
int MPI_Comm_size(MPI_Comm comm, int* size);
int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm comm);
int MPI_Allgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, const int* recvcounts,
                   const int* displs, MPI_Datatype recvtype, MPI_Comm comm);
int MPI_Error_string(int errorcode, char* string, int* resultlen);
