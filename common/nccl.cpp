#include "nccl.h"

#include <cstdio>
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

void broadcast(ncclComm_t comm, const Device& d, float* data, Elements n, int root) {
  MGPU_CHECK_NCCL_COMM(ncclBroadcast(data, data, n.count, ncclFloat32, root, comm, d.stream), comm);
}

void close_communicator(ncclComm_t& comm, bool abort) noexcept {
  if (!comm) return;
  // Checked as every NCCL call is, but reported instead of thrown: this runs in destructors,
  // often while another error unwinds the stack, and a second exception would end the program.
  const auto report = [](ncclResult_t status, const char* call) {
    if (status != ncclSuccess)
      std::fprintf(stderr, "warning: %s while closing a NCCL communicator: %s\n", call, ncclGetErrorString(status));
  };
  if (abort) {
    report(ncclCommAbort(comm), "ncclCommAbort");
  } else {
    report(ncclCommFinalize(comm), "ncclCommFinalize");
    report(ncclCommDestroy(comm), "ncclCommDestroy");
  }
  comm = nullptr;
}

}  // namespace mgpu
