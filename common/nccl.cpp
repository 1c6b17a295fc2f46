#include "nccl.h"

#include <string>

namespace mgpu {

void check_nccl(ncclResult_t status, const char* call, const char* file, int line, ncclComm_t comm) {
  // ncclInProgress is not a failure: a non-blocking communicator is still being set up.
  if (status == ncclSuccess || status == ncclInProgress) return;
  std::string message = std::string("NCCL error: ") + call + " at " + short_path(file) + ":" +
                        std::to_string(line) + ": " + ncclGetErrorString(status);
  const char* detail = ncclGetLastError(comm);
  if (detail && *detail) message += " (" + std::string(detail) + ")";
  throw Error(message);
}

void allreduce(ncclComm_t comm, const Device& d, float* data, Elements n, ncclRedOp_t op) {
  MGPU_CHECK_NCCL_COMM(ncclAllReduce(data, data, n.count, ncclFloat32, op, comm, d.stream), comm);
}

void close_communicator(ncclComm_t& comm, bool abort) noexcept {
  if (!comm) return;
  if (abort) {
    ncclCommAbort(comm);
  } else {
    ncclCommFinalize(comm);
    ncclCommDestroy(comm);
  }
  comm = nullptr;
}

}  // namespace mgpu
