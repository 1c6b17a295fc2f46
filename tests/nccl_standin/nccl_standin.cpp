// The cpu build's NCCL stand-in (nccl.h says what it is and is not).
#include "nccl.h"

#include <exception>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/cpu_stream.h"  // mgpu::cpu::Stream::wait: a rank's queued work, finished

// The ranks made together by one ncclCommInitAll.
struct Clique {
  int size;
};

struct ncclComm {
  std::shared_ptr<Clique> clique;
  int rank;
  std::string last_error;
};

namespace {

// One ncclAllReduce or ncclBroadcast call, queued by the group it was made in.
struct Call {
  const char* name;  // "ncclAllReduce" or "ncclBroadcast"
  ncclComm_t comm;
  const float* send;
  float* recv;
  std::size_t count;
  ncclRedOp_t op;  // ncclAllReduce's
  int root;        // ncclBroadcast's
  mgpu::StreamHandle stream;
};

// Groups are per thread, as NCCL's are.
thread_local int group_depth = 0;
nccl_standin::CommCalls comm_call_counts;  // every communicator call of the process (comm_calls())
thread_local std::vector<Call> group_calls;
thread_local std::string group_error;  // what ncclGetLastError(nullptr) says

ncclResult_t fail(ncclComm_t comm, ncclResult_t result, const std::string& why) {
  group_error = why;
  if (comm) comm->last_error = why;
  return result;
}

// The calls of one clique, one per rank (checked), run: every rank's stream drained, then the
// sum in rank order (or the root's values), then every rank's result written.
ncclResult_t run_clique(const std::vector<Call>& calls) {
  const Call& first = calls.front();
  const int size = first.comm->clique->size;
  std::set<int> ranks;
  for (const Call& c : calls) {
    if (!ranks.insert(c.comm->rank).second)
      return fail(c.comm, ncclInvalidUsage,
                  "rank " + std::to_string(c.comm->rank) + " made two collective calls in one group");
    if (std::string(c.name) != first.name || c.count != first.count || c.op != first.op || c.root != first.root)
      return fail(c.comm, ncclInvalidUsage,
                  std::string("the ranks of one collective differ in call, count, operation or root (rank ") +
                      std::to_string(c.comm->rank) + ": " + c.name + " of " + std::to_string(c.count) +
                      " floats, rank " + std::to_string(first.comm->rank) + ": " + first.name + " of " +
                      std::to_string(first.count) + ")");
  }
  if (static_cast<int>(ranks.size()) != size) {
    std::string missing;
    for (int r = 0; r < size; ++r)
      if (!ranks.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    return fail(first.comm, ncclInvalidUsage,
                "ncclGroupEnd: rank(s) " + missing + " of " + std::to_string(size) + " made no " + first.name +
                    " in this group; a real NCCL would wait for them forever");
  }
  for (const Call& c : calls) {
    try {
      c.stream->wait();
    } catch (const std::exception& e) {
      return fail(c.comm, ncclUnhandledCudaError, std::string("a rank's stream failed: ") + e.what());
    }
  }
  std::vector<float> result(first.count, 0.0f);
  if (first.root >= 0) {  // ncclBroadcast: the root's values
    for (const Call& c : calls)
      if (c.comm->rank == first.root) result.assign(c.send, c.send + c.count);
  } else {  // ncclAllReduce: the sum in rank order (or its mean)
    for (int r = 0; r < size; ++r)
      for (const Call& c : calls)
        if (c.comm->rank == r)
          for (std::size_t j = 0; j < c.count; ++j) result[j] += c.send[j];
    if (first.op == ncclAvg)
      for (float& v : result) v /= static_cast<float>(size);
  }
  for (const Call& c : calls)
    for (std::size_t j = 0; j < c.count; ++j) c.recv[j] = result[j];
  return ncclSuccess;
}

}  // namespace

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (the cpu stand-in: a stream's error)";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t comm) { return comm ? comm->last_error.c_str() : group_error.c_str(); }

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int*) {
  if (!comms || ndev < 1) return fail(nullptr, ncclInvalidArgument, "ncclCommInitAll: no communicators asked for");
  const auto clique = std::make_shared<Clique>(Clique{ndev});
  for (int i = 0; i < ndev; ++i) comms[i] = new ncclComm{clique, i, ""};
  comm_call_counts.made += ndev;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  ++comm_call_counts.finalized;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  ++comm_call_counts.destroyed;
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  ++comm_call_counts.aborted;
  delete comm;
  return ncclSuccess;
}

nccl_standin::CommCalls nccl_standin::comm_calls() { return comm_call_counts; }

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;  // a nested group ends with the outermost
  std::vector<Call> calls;
  calls.swap(group_calls);
  // The calls of each clique, in the order their first rank called.
  while (!calls.empty()) {
    const Clique* clique = calls.front().comm->clique.get();
    std::vector<Call> mine, rest;
    for (const Call& c : calls) (c.comm->clique.get() == clique ? mine : rest).push_back(c);
    const ncclResult_t result = run_clique(mine);
    if (result != ncclSuccess) return result;
    calls.swap(rest);
  }
  return ncclSuccess;
}

namespace {

// Queues `call` in this thread's group, or runs it at once where it has nobody to wait for.
ncclResult_t queue_or_run(const Call& call) {
  if (group_depth > 0) {
    group_calls.push_back(call);
    return ncclSuccess;
  }
  if (call.comm->clique->size > 1)
    return fail(call.comm, ncclInvalidUsage,
                std::string(call.name) + " for rank " + std::to_string(call.comm->rank) + " of " +
                    std::to_string(call.comm->clique->size) +
                    " outside ncclGroupStart/ncclGroupEnd: it may wait for the other ranks' calls, which this thread "
                    "makes only after it returns (a deadlock on a real NCCL; the cpu build's stand-in refuses "
                    "instead of hanging)");
  return run_clique({call});  // one rank: nothing to wait for
}

}  // namespace

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, std::size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, mgpu::StreamHandle stream) {
  if (!comm) return fail(nullptr, ncclInvalidArgument, "ncclAllReduce: no communicator");
  if (datatype != ncclFloat32 || (op != ncclSum && op != ncclAvg) || !stream || (count > 0 && (!sendbuff || !recvbuff)))
    return fail(comm, ncclInvalidArgument, "ncclAllReduce: the cpu stand-in takes float32 buffers, ncclSum or ncclAvg");
  return queue_or_run(Call{"ncclAllReduce", comm, static_cast<const float*>(sendbuff), static_cast<float*>(recvbuff),
                           count, op, /*root=*/-1, stream});
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, std::size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, mgpu::StreamHandle stream) {
  if (!comm) return fail(nullptr, ncclInvalidArgument, "ncclBroadcast: no communicator");
  if (datatype != ncclFloat32 || !stream || (count > 0 && !recvbuff) ||
      (count > 0 && comm->rank == root && !sendbuff))
    return fail(comm, ncclInvalidArgument, "ncclBroadcast: the cpu stand-in takes float32 buffers");
  if (root < 0 || root >= comm->clique->size)
    return fail(comm, ncclInvalidArgument,
                "ncclBroadcast: root " + std::to_string(root) + " is not a rank of " +
                    std::to_string(comm->clique->size));
  return queue_or_run(Call{"ncclBroadcast", comm, static_cast<const float*>(sendbuff), static_cast<float*>(recvbuff),
                           count, ncclSum, root, stream});
}
