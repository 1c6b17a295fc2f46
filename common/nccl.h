// NCCL, checked and typed. Built only where the cuda build finds NCCL (target mgpu_nccl,
// which defines MGPU_HAVE_NCCL=1 for whoever links it).
//
// NCCL counts ELEMENTS of a datatype, never bytes: allreduce() takes mgpu::Elements and
// names the datatype itself, so a byte count cannot slip in.
#pragma once
#include <nccl.h>

#include "device.h"

namespace mgpu {

// Throws mgpu::Error naming the call, file and line, with ncclGetErrorString and, for a
// communicator, ncclGetLastError (NCCL's own description of what went wrong).
void check_nccl(ncclResult_t status, const char* call, const char* file, int line, ncclComm_t comm = nullptr);

// Queues an in-place allreduce of n floats on d's stream (inside a group or alone).
void allreduce(ncclComm_t comm, const Device& d, float* data, Elements n, ncclRedOp_t op);

// Queues an in-place broadcast of n floats on d's stream: every rank of comm's clique ends
// holding rank `root`'s values (inside a group or alone).
void broadcast(ncclComm_t comm, const Device& d, float* data, Elements n, int root);

// Ends a communicator and sets it to nullptr; never throws (a failing call is reported on
// stderr). Normally ncclCommFinalize (which
// waits for the collectives still queued on it) then ncclCommDestroy. With `abort` (an error is
// unwinding the stack, or NCCL reported an asynchronous error) the peers may never join another
// collective, so finalizing could wait forever: ncclCommAbort stops its work without waiting.
void close_communicator(ncclComm_t& comm, bool abort) noexcept;

}  // namespace mgpu

#define MGPU_CHECK_NCCL(call) ::mgpu::check_nccl((call), #call, __FILE__, __LINE__)
#define MGPU_CHECK_NCCL_COMM(call, comm) ::mgpu::check_nccl((call), #call, __FILE__, __LINE__, (comm))
