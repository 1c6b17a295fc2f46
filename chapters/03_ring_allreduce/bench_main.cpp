// Chapter 03's benchmark: chapter 02's allreduce against the ring, nccl-tests style.
//   build/bin/03_allreduce_bench [--devices 2,4,8] [--min-bytes 4] [--max-bytes 256M] ...
#include "benchmark.h"

int main(int argc, char** argv) { return bench::main_program(argc, argv, "03_allreduce_bench", bench::naive_and_ring); }
