// The cpu build's stand-in for NCCL, for one purpose: to run chapter 04's NcclAllreduce and
// broadcast, and so grade its exercises (ex04.*), on a machine without GPUs. It is not NCCL: it
// has the few calls chapter 04 and common/nccl.cpp make, with NCCL's names, types and return
// codes, over the cpu build's devices (host memory, one stream each), and it sums (or copies)
// on the host.
//
// What it keeps of NCCL is the rule the exercise is about. One thread drives every rank, so an
// ncclAllReduce or ncclBroadcast made outside ncclGroupStart/ncclGroupEnd with more than one
// rank may wait for the other ranks' calls, which that thread makes only after it returns: on a
// real NCCL, a deadlock (or not, depending on the version: chapter 04's exercise 2). The
// stand-in refuses that call with ncclInvalidUsage and says why, and ncclGroupEnd refuses a
// group in which some rank of a communicator made no call, or the ranks' calls, counts,
// operations or roots differ.
//
// How a group runs: ncclGroupEnd waits for each rank's stream (everything queued before the
// call), then adds the ranks' buffers in rank order, in float (a broadcast: takes the root's),
// and writes every rank's result before it returns; work queued afterwards comes after it, as
// on a GPU's stream.
//
// Built only in the cpu build, and only into the test of chapter 04 (tests/CMakeLists.txt): no
// program is linked with it, and MGPU_HAVE_NCCL stays undefined, so nothing else takes it for
// NCCL.
#pragma once
#include <cstddef>

#include "common/device.h"  // mgpu::StreamHandle: where NCCL takes a cudaStream_t

typedef struct ncclComm* ncclComm_t;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,  // here: a rank's stream failed before the collective
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

typedef enum { ncclFloat32 = 7, ncclFloat = 7 } ncclDataType_t;  // the one type chapter 04 sends

const char* ncclGetErrorString(ncclResult_t result);
// What went wrong last, in words: on `comm`, or (comm null) in this thread's last group.
const char* ncclGetLastError(ncclComm_t comm);

// ndev communicators of one clique, rank i in comms[i]; devlist is not read (a cpu device has
// no GPU ordinal).
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist);
ncclResult_t ncclCommFinalize(ncclComm_t comm);  // nothing is left queued: returns at once
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);

ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

// Sum (ncclSum) or mean (ncclAvg) of count floats over the ranks, into every rank's recvbuff.
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, std::size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, mgpu::StreamHandle stream);

// Rank root's count floats into every rank's recvbuff (sendbuff is read on the root only).
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, std::size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, mgpu::StreamHandle stream);

// Not NCCL: the stand-in's count of the communicator calls made so far in this process, so that
// a test can see a communicator's life (made; finalized and destroyed, or aborted) on a CPU.
namespace nccl_standin {
struct CommCalls {
  int made = 0, finalized = 0, destroyed = 0, aborted = 0;
};
CommCalls comm_calls();
}  // namespace nccl_standin
